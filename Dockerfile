# The pgembed sync worker (and CLI). CPU-only torch, pinned: PyPI's torch for Linux is the CUDA
# build (several GB); for a GPU image, drop the --index-url option.
FROM python:3.11.11-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1

WORKDIR /app
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

COPY pyproject.toml README.md ./
COPY pgembed ./pgembed
RUN pip install .

# Runs as an unprivileged user; the database URL comes from the environment (PGEMBED_DATABASE_URL).
RUN useradd --create-home pgembed
USER pgembed

ENTRYPOINT ["pgembed"]
CMD ["sync"]
