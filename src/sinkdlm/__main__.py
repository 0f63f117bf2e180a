"""`python -m sinkdlm ...` (also what `torchrun -m sinkdlm train ...` runs)."""

from sinkdlm.cli import main

if __name__ == "__main__":
    main()
