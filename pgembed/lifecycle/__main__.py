"""`python -m pgembed.lifecycle` writes generated.py again from the model settings declared in
options.py (a unit test fails while it is stale)."""

from pgembed.lifecycle import options

options.write()
print(f"wrote {options.GENERATED}")
