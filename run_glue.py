"""Entry point of the glue task: `python run_glue.py --help` (bert_ipu/tasks/glue/ says what it does)."""
from bert_ipu.cli import run

if __name__ == "__main__":
    run("glue", __file__)
