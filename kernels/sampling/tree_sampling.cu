// Device sampling and verification (tree_sampling.h). The host reference is engine/spec's
// verify() with engine/sampling's processors; these kernels follow it step by step:
//
// process_rows_kernel (one 1024-thread block per distinct logits row):
//   the logit bias on the item's bias ids (one fp32 add each, __fadd_rn as the host's plain add),
//   then penalties on the few ids of the item's context and the node's path (the repetition
//   penalty, then presence + frequency * count, in fp32 with explicit rounding so nvcc cannot
//   contract it into an FMA the host does not do); greedy: lowest-index argmax. Sampled:
//   temperature, the finiteness check, top-k by bisection on the order-preserving uint32 key of the
//   logits (the k-th largest key is the largest t with #{key >= t} >= k), then the row becomes
//   weights w = exp(x - max) (0 where filtered), top-p by the same bisection weighted by w (the
//   boundary value v* is the largest with mass(w >= v*) >= top_p * sum w; among tokens equal to v*
//   the lower ids count as more likely, as the host's stable sort does), min-p (w < min_p, since
//   the largest w is 1), and the normalised probabilities in place.
// walk_kernel (one 1024-thread block per item): the tree's children lists in shared memory, then
//   greedy matching from the rows' argmax ids, or the rejection walk: at each node the row is
//   copied to the item's work buffer; a deterministic child x is accepted with probability
//   p(x) (else p(x) = 0), a sampled one with min(1, p(x) / q(x)) (else p = max(p - q, 0));
//   without an accepted child the bonus token is an inverse-CDF draw over the residual.
// Every block-wide reduction sums in a fixed order, so results do not depend on timing.
#include <cmath>
#include <cstdint>

#include "kernels/sampling/tree_sampling.h"

namespace arbor::kernels {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxNodes = 1024;
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ uint32_t key_of(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float float_of(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Block-wide reductions: every thread gets the result, summed in warp order (deterministic).
// Each begins with a barrier so the shared scratch can be reused back to back.
__device__ double block_sum(double v, double* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  __syncthreads();
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  double t = 0.0;
  for (int w = 0; w < kWarps; ++w) t += red[w];
  return t;
}

__device__ long long block_sum_ll(long long v, long long* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  __syncthreads();
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  long long t = 0;
  for (int w = 0; w < kWarps; ++w) t += red[w];
  return t;
}

__device__ int block_max_int(int v, int* red) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(kFull, v, o));
  __syncthreads();
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  int t = red[0];
  for (int w = 1; w < kWarps; ++w) t = max(t, red[w]);
  return t;
}

__device__ int block_min_int(int v, int* red) {
  return -block_max_int(-v, red);
}

__device__ float block_max_float(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  __syncthreads();
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  float t = red[0];
  for (int w = 1; w < kWarps; ++w) t = fmaxf(t, red[w]);
  return t;
}

// Exclusive prefix sum of one value per thread (thread order).
__device__ double block_exclusive_scan(double v, double* red) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  double inc = v;
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_up_sync(kFull, inc, o);
    if (lane >= o) inc += y;
  }
  double exc = __shfl_up_sync(kFull, inc, 1);
  if (lane == 0) exc = 0.0;
  __syncthreads();
  if (lane == 31) red[warp] = inc;
  __syncthreads();
  double base = 0.0;
  for (int w = 0; w < warp; ++w) base += red[w];
  return base + exc;
}

struct Shared {
  double red_d[kWarps];
  long long red_ll[kWarps];
  int red_i[kWarps];
  float red_f[kWarps];
};

// The largest key t with sum over elements with key(x) >= t of weight(x) >= target (which
// must hold for t = 0). Bisection over the 32-bit key space: 32 block-wide passes.
template <typename Weight>
__device__ uint32_t largest_key_with_mass(const float* x, int n, double target, Weight weight,
                                          Shared& sh) {
  uint32_t lo = 0, hi = 0xffffffffu;
  while (lo < hi) {
    const uint32_t mid = lo + static_cast<uint32_t>((static_cast<uint64_t>(hi) - lo + 1) / 2);
    double acc = 0.0;
    for (int i = threadIdx.x; i < n; i += kThreads) {
      const float v = x[i];
      if (key_of(v) >= mid) acc += weight(v);
    }
    if (block_sum(acc, sh.red_d) >= target)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

__device__ __forceinline__ float penalize(float v, const TreeSampleItemParams& prm, int out_count) {
  if (prm.repetition_penalty != 1.0f)
    v = v < 0.0f ? __fmul_rn(v, prm.repetition_penalty) : __fdiv_rn(v, prm.repetition_penalty);
  if ((prm.presence_penalty != 0.0f || prm.frequency_penalty != 0.0f) && out_count > 0)
    v = __fsub_rn(v, __fadd_rn(prm.presence_penalty,
                               __fmul_rn(prm.frequency_penalty, static_cast<float>(out_count))));
  return v;
}

__device__ bool contains_sorted(const int32_t* a, int n, int32_t t) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (a[mid] < t)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < n && a[lo] == t;
}

__global__ void __launch_bounds__(kThreads) process_rows_kernel(const TreeSampleLaunch p) {
  __shared__ Shared sh;
  __shared__ int32_t path[kMaxNodes];
  __shared__ int path_len;
  const int tid = threadIdx.x;
  const int g = p.task_node[blockIdx.x], item = p.task_item[blockIdx.x];
  const int first = p.node_indptr[item];
  const TreeSampleItemParams prm = p.params[item];
  const int64_t row = p.logits_row[g];
  const int n = static_cast<int>(p.vocab);
  float* x = p.logits + row * p.vocab;

  // Logit bias, before the penalties (Sampler::process_logits' order). An item's bias ids are
  // distinct, so each entry is one thread's.
  if (p.bias_indptr != nullptr) {
    const int b0 = p.bias_indptr[item], b1 = p.bias_indptr[item + 1];
    if (b0 < b1) {  // the same for the whole block
      for (int e = b0 + tid; e < b1; e += kThreads) {
        const int32_t t = p.bias_token[e];
        x[t] = __fadd_rn(x[t], p.bias_value[e]);
      }
      __syncthreads();
    }
  }

  // Penalties: the context's distinct ids (each counted with its path occurrences), then path
  // ids that are not in the context (first occurrence handles the token).
  if (prm.repetition_penalty != 1.0f || prm.presence_penalty != 0.0f ||
      prm.frequency_penalty != 0.0f) {
    if (tid == 0) {
      int len = 0;
      for (int node = g - first; node > 0; node = p.parent[first + node])
        path[len++] = p.token[first + node];
      path_len = len;
    }
    __syncthreads();
    const int len = path_len;
    const int c0 = p.ctx_indptr[item], c1 = p.ctx_indptr[item + 1];
    for (int e = c0 + tid; e < c1; e += kThreads) {
      const int32_t t = p.ctx_token[e];
      int in_path = 0;
      for (int j = 0; j < len; ++j) in_path += path[j] == t;
      x[t] = penalize(x[t], prm, p.ctx_output_count[e] + in_path);
    }
    for (int j = tid; j < len; j += kThreads) {
      const int32_t t = path[j];
      bool repeat = false;
      for (int k = 0; k < j; ++k) repeat = repeat || path[k] == t;
      if (repeat || contains_sorted(p.ctx_token + c0, c1 - c0, t)) continue;
      int count = 0;
      for (int k = 0; k < len; ++k) count += path[k] == t;
      x[t] = penalize(x[t], prm, count);
    }
    __syncthreads();
  }

  if (prm.greedy) {
    // Lowest-index maximum; -1 with a NaN / +inf or only -inf (argmax_rows' contract).
    float best = -INFINITY;
    int best_i = 0x7fffffff, bad = 0, finite = 0;
    for (int i = tid; i < n; i += kThreads) {
      const float v = x[i];
      bad |= isnan(v) || v == INFINITY;
      finite |= v != -INFINITY;
      if (v > best) {
        best = v;
        best_i = i;
      }
    }
    const float m = block_max_float(best, sh.red_f);
    const int idx = block_min_int(best == m && finite ? best_i : 0x7fffffff, sh.red_i);
    const int any_bad = block_max_int(bad, sh.red_i), any_finite = block_max_int(finite, sh.red_i);
    if (tid == 0) {
      const bool ok = !any_bad && any_finite;
      p.row_argmax[row] = ok ? idx : -1;
      p.row_status[row] = ok ? 0 : 1;
    }
    return;
  }

  // Temperature, finiteness, max.
  const float temp = prm.temperature;
  float mx = -INFINITY;
  int bad = 0, finite = 0;
  for (int i = tid; i < n; i += kThreads) {
    float v = x[i];
    if (temp != 1.0f) {
      v = __fdiv_rn(v, temp);
      x[i] = v;
    }
    bad |= isnan(v) || v == INFINITY;
    finite |= v != -INFINITY;
    mx = fmaxf(mx, v);
  }
  mx = block_max_float(mx, sh.red_f);
  bad = block_max_int(bad, sh.red_i);
  finite = block_max_int(finite, sh.red_i);
  if (bad || !finite) {
    if (tid == 0) p.row_status[row] = 1;
    return;
  }

  // Top-k: keep values >= the k-th largest (ties with it survive).
  if (prm.top_k > 0 && prm.top_k < n) {
    const uint32_t kth_key = largest_key_with_mass(
        x, n, static_cast<double>(prm.top_k), [](float) { return 1.0; }, sh);
    const float kth = float_of(kth_key);
    __syncthreads();
    for (int i = tid; i < n; i += kThreads)
      if (x[i] < kth) x[i] = -INFINITY;
    __syncthreads();
  }

  // Weights relative to the largest logit (which every filter keeps).
  double total = 0.0;
  for (int i = tid; i < n; i += kThreads) {
    const float v = x[i];
    const float w = v == -INFINITY ? 0.0f : expf(v - mx);
    x[i] = w;
    total += w;
  }
  total = block_sum(total, sh.red_d);

  // Top-p.
  if (prm.top_p < 1.0f) {
    const double target = static_cast<double>(prm.top_p) * total;
    const uint32_t boundary_key = largest_key_with_mass(
        x, n, target, [](float w) { return static_cast<double>(w); }, sh);
    const float boundary = float_of(boundary_key);
    double above = 0.0;
    long long ties = 0;
    for (int i = tid; i < n; i += kThreads) {
      const float w = x[i];
      above += w > boundary ? static_cast<double>(w) : 0.0;
      ties += w == boundary;
    }
    above = block_sum(above, sh.red_d);
    ties = block_sum_ll(ties, sh.red_ll);
    if (ties <= 1) {
      for (int i = tid; i < n; i += kThreads)
        if (x[i] < boundary) x[i] = 0.0f;
    } else {
      // Tokens equal to the boundary are kept in id order while the mass before them stays
      // below top_p: a contiguous id range per thread, the ranks from a scan of tie counts.
      const int chunk = (n + kThreads - 1) / kThreads;
      const int lo = min(n, tid * chunk), hi = min(n, lo + chunk);
      int mine = 0;
      for (int i = lo; i < hi; ++i) mine += x[i] == boundary;
      double rank = block_exclusive_scan(static_cast<double>(mine), sh.red_d);
      for (int i = lo; i < hi; ++i) {
        const float w = x[i];
        if (w < boundary) {
          x[i] = 0.0f;
        } else if (w == boundary) {
          if (!(above + rank * static_cast<double>(boundary) < target)) x[i] = 0.0f;
          rank += 1.0;
        }
      }
    }
    __syncthreads();
  }

  // Min-p (the largest weight is exp(0) = 1), then normalise.
  double kept = 0.0;
  for (int i = tid; i < n; i += kThreads) {
    float w = x[i];
    if (prm.min_p > 0.0f && w < prm.min_p) {
      w = 0.0f;
      x[i] = 0.0f;
    }
    kept += w;
  }
  kept = block_sum(kept, sh.red_d);
  for (int i = tid; i < n; i += kThreads)
    x[i] = static_cast<float>(static_cast<double>(x[i]) / kept);
  if (tid == 0) p.row_status[row] = 0;
}

// Inverse-CDF draw over w[0, n) (non-negative, positive sum) with uniform u: the first index
// whose running sum exceeds u * sum, never a zero weight; the last positive index otherwise.
__device__ int categorical(const float* w, int n, double u, Shared& sh) {
  const int tid = threadIdx.x;
  const int chunk = (n + kThreads - 1) / kThreads;
  const int lo = min(n, tid * chunk), hi = min(n, lo + chunk);
  double mine = 0.0;
  int last = -1;
  for (int i = lo; i < hi; ++i) {
    mine += w[i];
    if (w[i] > 0.0f) last = i;
  }
  const double before = block_exclusive_scan(mine, sh.red_d);
  const double total = block_sum(mine, sh.red_d);
  const int last_positive = block_max_int(last, sh.red_i);
  const double target = u * total;
  int found = 0x7fffffff;
  if (before + mine > target) {
    double cum = before;
    for (int i = lo; i < hi; ++i) {
      cum += w[i];
      if (w[i] > 0.0f && target < cum) {
        found = i;
        break;
      }
    }
  }
  const int first = block_min_int(found, sh.red_i);
  return first < last_positive ? first : last_positive;
}

__global__ void __launch_bounds__(kThreads) walk_kernel(const TreeSampleLaunch p) {
  __shared__ Shared sh;
  __shared__ int32_t child_offset[kMaxNodes + 1];
  __shared__ int32_t child_list[kMaxNodes];
  __shared__ int32_t fill[kMaxNodes];
  const int tid = threadIdx.x;
  const int item = blockIdx.x;
  const int first = p.node_indptr[item], t = p.node_indptr[item + 1] - first;
  const TreeSampleItemParams prm = p.params[item];
  const int n = static_cast<int>(p.vocab);
  const int32_t* parent = p.parent + first;
  const int32_t* token = p.token + first;

  // Children lists in index order (counting sort by parent).
  for (int i = tid; i <= t; i += kThreads) child_offset[i] = 0;
  __syncthreads();
  if (tid == 0) {
    for (int j = 1; j < t; ++j) child_offset[parent[j] + 1]++;
    for (int i = 0; i < t; ++i) {
      child_offset[i + 1] += child_offset[i];
      fill[i] = child_offset[i];
    }
    for (int j = 1; j < t; ++j) child_list[fill[parent[j]]++] = j;
  }
  __syncthreads();

  if (prm.greedy) {
    if (tid != 0) return;
    // fill[] becomes the greedy token after each matched node (-2: not matched).
    int best = 0, best_depth = 0, status = 0;
    int32_t* next = fill;
    __shared__ int32_t depth[kMaxNodes];
    depth[0] = 0;
    for (int j = 0; j < t && status == 0; ++j) {
      if (j > 0) {
        depth[j] = depth[parent[j]] + 1;
        const int nx = next[parent[j]];
        if (nx < 0 || token[j] != nx) {
          next[j] = -2;
          continue;
        }
        if (depth[j] > best_depth) {  // ascending j: the first at a depth is the lowest index
          best = j;
          best_depth = depth[j];
        }
      }
      const int a = p.row_argmax[p.logits_row[first + j]];
      if (a < 0) status = 1;
      next[j] = a;
    }
    int len = 0;
    if (status == 0) {
      len = best_depth + 1;
      for (int node = best, d = best_depth; d >= 0; node = parent[node], --d) {
        p.out_path[first + d] = node;
        p.out_tried[first + d] = child_offset[node + 1] - child_offset[node];
      }
    } else {
      p.out_path[first] = 0;
      p.out_tried[first] = 0;
      len = 1;
    }
    p.out_len[item] = len;
    p.out_bonus[item] = status == 0 ? next[best] : -1;
    p.out_used[item] = 0;
    p.out_status[item] = status;
    return;
  }

  const double* u = p.uniforms + p.uniform_indptr[item];
  float* w = p.work + static_cast<int64_t>(item) * p.vocab;
  int node = 0, used = 0, len = 0, status = 0, bonus = -1;
  while (true) {
    const int64_t row = p.logits_row[first + node];
    if (p.row_status[row] != 0) {
      status = 1;
      break;
    }
    const float* prob = p.logits + row * p.vocab;
    double s = 0.0;
    for (int i = tid; i < n; i += kThreads) {
      w[i] = prob[i];
      s += prob[i];
    }
    s = block_sum(s, sh.red_d);
    const int qr = p.q_row ? p.q_row[first + node] : -1;
    const float* q = qr >= 0 ? p.q + static_cast<int64_t>(qr) * p.vocab : nullptr;
    double sq = 0.0;
    if (q) {
      for (int i = tid; i < n; i += kThreads) sq += q[i];
      sq = block_sum(sq, sh.red_d);
    }
    int accepted = -1, tried = 0;
    for (int c = child_offset[node]; c < child_offset[node + 1]; ++c) {
      const int child = child_list[c];
      const int32_t x = token[child];
      const double uu = u[used++];
      ++tried;
      const double px = static_cast<double>(w[x]) / s;
      if (q == nullptr) {
        if (uu < fmin(1.0, px)) {
          accepted = child;
          break;
        }
        __syncthreads();  // every thread has read w[x]
        if (tid == 0) w[x] = 0.0f;
        double r = 0.0;
        __syncthreads();
        for (int i = tid; i < n; i += kThreads) r += w[i];
        s = block_sum(r, sh.red_d);
      } else {
        const double qx = static_cast<double>(q[x]) / sq;
        if (uu < fmin(1.0, px / qx)) {
          accepted = child;
          break;
        }
        double mass = 0.0;
        for (int i = tid; i < n; i += kThreads)
          mass += fmax(static_cast<double>(w[i]) / s - static_cast<double>(q[i]) / sq, 0.0);
        mass = block_sum(mass, sh.red_d);
        if (mass > 0.0) {  // else only rounding emptied it: p stands (as on the host)
          double r = 0.0;
          for (int i = tid; i < n; i += kThreads) {
            const float v = static_cast<float>(
                fmax(static_cast<double>(w[i]) / s - static_cast<double>(q[i]) / sq, 0.0));
            w[i] = v;
            r += v;
          }
          s = block_sum(r, sh.red_d);
        }
      }
    }
    if (tid == 0) {
      p.out_path[first + len] = node;
      p.out_tried[first + len] = tried;
    }
    ++len;
    if (accepted < 0) {
      __syncthreads();
      bonus = categorical(w, n, u[used++], sh);
      break;
    }
    node = accepted;
    __syncthreads();  // the next node's copy overwrites w
  }
  if (tid == 0) {
    if (status != 0) {  // the request fails: no path, no randomness used
      p.out_path[first] = 0;
      p.out_tried[first] = 0;
      len = 1;
      used = 0;
    }
    p.out_len[item] = len;
    p.out_bonus[item] = bonus;
    p.out_used[item] = used;
    p.out_status[item] = status;
  }
}

}  // namespace

cudaError_t launch_tree_sample(const TreeSampleLaunch& p, cudaStream_t stream) {
  if (p.num_items == 0) return cudaSuccess;
  if (p.vocab <= 0 || p.vocab >= 0x7fffffff || p.num_tasks <= 0) return cudaErrorInvalidValue;
  process_rows_kernel<<<p.num_tasks, kThreads, 0, stream>>>(p);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  walk_kernel<<<p.num_items, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace arbor::kernels
