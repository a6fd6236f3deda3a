// CUDA kernel of bert_ipu::packed_attention_mask (schema and CPU kernel: packed_attention_mask.cpp).
// One thread block per (pack, query row); the block's threads stride over the key positions. The row's
// own id is read once; the pack's ids are read coalesced. Launched on the current stream.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <limits>

#include "packed_attention_mask.h"

namespace bert_ipu {
namespace {

template <typename out_t, typename id_t>
__global__ void fill_mask_kernel(const id_t* __restrict__ ids, out_t* __restrict__ out, int64_t len, bool causal) {
  const int64_t row = blockIdx.x;  // pack * len + query position
  const id_t* pack = ids + (row / len) * len;
  const int64_t i = row % len;
  const id_t me = pack[i];
  const out_t blocked = std::numeric_limits<out_t>::lowest();
  out_t* dst = out + row * len;
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
    dst[j] = pack[j] == me && (!causal || j <= i) ? out_t(0) : blocked;
}

at::Tensor packed_attention_mask_cuda(const at::Tensor& sequence_ids, std::optional<at::ScalarType> dtype,
                                      bool causal) {
  const at::ScalarType out_type = dtype.value_or(at::kFloat);
  check_packed_attention_mask_args(sequence_ids, out_type);
  const c10::cuda::CUDAGuard guard(sequence_ids.device());
  const at::Tensor ids = sequence_ids.contiguous();
  const int64_t batch = ids.size(0), len = ids.size(1);
  at::Tensor out = at::empty({batch, 1, len, len}, ids.options().dtype(out_type));
  if (out.numel() == 0) return out;
  const int threads = len >= 256 ? 256 : 128;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_INTEGRAL_TYPES(ids.scalar_type(), "packed_attention_mask_ids", [&] {
    using id_t = scalar_t;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out_type, "packed_attention_mask_out", [&] {
      fill_mask_kernel<scalar_t, id_t><<<batch * len, threads, 0, stream>>>(
          ids.data_ptr<id_t>(), out.data_ptr<scalar_t>(), len, causal);
    });
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace
}  // namespace bert_ipu

TORCH_LIBRARY_IMPL(bert_ipu, CUDA, m) {
  m.impl("packed_attention_mask", &bert_ipu::packed_attention_mask_cuda);
}
