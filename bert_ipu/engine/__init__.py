"""The training engine every packed task shares: runtime (device, processes, precision), optimizer,
checkpointer, metrics, parallelism and one trainer loop. It knows nothing about BERT pretraining: a task
(bert_ipu/tasks/) supplies the model, the packed data, the loss as sums and counts, evaluation and export."""
