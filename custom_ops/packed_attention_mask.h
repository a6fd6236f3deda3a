#pragma once
#include <ATen/ATen.h>

namespace bert_ipu {
// Shared argument checks of every backend's kernel (same messages on CPU and CUDA).
void check_packed_attention_mask_args(const at::Tensor& sequence_ids, at::ScalarType dtype);
}  // namespace bert_ipu
