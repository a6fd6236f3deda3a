"""Entry point of the squad task: `python run_squad.py --help` (bert_ipu/tasks/squad/ says what it does)."""
from bert_ipu.cli import run

if __name__ == "__main__":
    run("squad", __file__)
