"""`python -m bert_ipu --config NAME ...`: run a config of any kind (bert_ipu/cli.py)."""
from bert_ipu.cli import run

if __name__ == "__main__":
    run(None, __file__)
