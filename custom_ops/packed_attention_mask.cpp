// bert_ipu::packed_attention_mask: the additive attention mask of a batch of packs, built on the device
// from per-token sequence ids, so that no (S x S) mask is ever made on the host.
//
//   sequence_ids: (batch, pack_len) integer; 1..k for the k sequences of a pack, 0 for padding
//   causal:       false (encoders, BERT): i may attend to every j of its sequence;
//                 true (decoders, GPT-2 / Llama): only to j <= i of its sequence (document-causal)
//   returns:      (batch, 1, pack_len, pack_len) in `dtype` (default float32):
//                 0 where token i may attend to token j (same sequence id, and j <= i when causal; padding
//                 attends to padding, so no row is empty: i always attends to itself, and softmax never sees
//                 a row of -inf), lowest finite value elsewhere.
//
// The schema is defined once here; each backend registers its kernel in its own TORCH_LIBRARY_IMPL
// (the CUDA one lives in packed_attention_mask_cuda.cu). The fake (meta) kernel and a pure-PyTorch
// reference are in bert_ipu/ops.py.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <limits>

#include "packed_attention_mask.h"

namespace bert_ipu {

void check_packed_attention_mask_args(const at::Tensor& sequence_ids, at::ScalarType dtype) {
  TORCH_CHECK(sequence_ids.dim() == 2, "packed_attention_mask: sequence_ids must be (batch, pack_len), got ",
              sequence_ids.dim(), " dimensions");
  TORCH_CHECK(at::isIntegralType(sequence_ids.scalar_type(), /*includeBool=*/false),
              "packed_attention_mask: sequence_ids must be an integer tensor, got ", sequence_ids.scalar_type());
  TORCH_CHECK(at::isFloatingType(dtype), "packed_attention_mask: dtype must be a floating type, got ", dtype);
}

namespace {

template <typename out_t, typename id_t>
void fill_mask(const id_t* ids, out_t* out, int64_t batch, int64_t len, bool causal) {
  const out_t blocked = std::numeric_limits<out_t>::lowest();
  const out_t open = out_t(0);
  // one task per (pack, query row); each row compares one id against the pack's ids
  at::parallel_for(0, batch * len, /*grain_size=*/16, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const id_t* pack = ids + (row / len) * len;
      const int64_t i = row % len;
      const id_t me = pack[i];
      out_t* dst = out + row * len;
      const int64_t last = causal ? i : len - 1;  // keys after `last` are in the future
      for (int64_t j = 0; j <= last; ++j) dst[j] = pack[j] == me ? open : blocked;
      for (int64_t j = last + 1; j < len; ++j) dst[j] = blocked;
    }
  });
}

at::Tensor packed_attention_mask_cpu(const at::Tensor& sequence_ids, std::optional<at::ScalarType> dtype,
                                     bool causal) {
  const at::ScalarType out_type = dtype.value_or(at::kFloat);
  check_packed_attention_mask_args(sequence_ids, out_type);
  const at::Tensor ids = sequence_ids.contiguous();
  const int64_t batch = ids.size(0), len = ids.size(1);
  at::Tensor out = at::empty({batch, 1, len, len}, ids.options().dtype(out_type));
  AT_DISPATCH_INTEGRAL_TYPES(ids.scalar_type(), "packed_attention_mask_ids", [&] {
    using id_t = scalar_t;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out_type, "packed_attention_mask_out", [&] {
      fill_mask<scalar_t, id_t>(ids.data_ptr<id_t>(), out.data_ptr<scalar_t>(), batch, len, causal);
    });
  });
  return out;
}

}  // namespace
}  // namespace bert_ipu

TORCH_LIBRARY(bert_ipu, m) {
  m.def("packed_attention_mask(Tensor sequence_ids, ScalarType? dtype=None, bool causal=False) -> Tensor");
}

TORCH_LIBRARY_IMPL(bert_ipu, CPU, m) {
  m.impl("packed_attention_mask", &bert_ipu::packed_attention_mask_cpu);
}
