"""Vendor engines: a backend's own RNN kernels on packed sequences.
`common` holds what every vendor engine does (eligibility checks, pair
splitting, packing by length, empty rows); `torch_kernels` runs PyTorch's
`torch.gru`/`torch.lstm`/`torch.rnn_*` (cuDNN on a GPU), `jax_kernels`
cuDNN's LSTM through JAX on a GPU. Each is imported on its backend only."""
