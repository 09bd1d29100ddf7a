#include "engine/model/ggml_quants.h"

#include <cstring>

#include "engine/core/dtype.h"
#include "engine/core/error.h"

namespace arbor {
namespace {

constexpr int kQK = 32;     // elements per block of the legacy formats (Q4_0 .. Q8_0)
constexpr int kQK_K = 256;  // elements per super-block of the K formats

uint16_t load_u16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
float load_f16(const uint8_t* p) {
  return f16_to_f32(load_u16(p));
}
uint32_t load_u32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
float load_f32(const uint8_t* p) {
  uint32_t bits = load_u32(p);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// block_q4_0 { f16 d; u8 qs[16]; }
void dequant_q4_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
    y[j + kQK / 2] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

// block_q4_1 { f16 d; f16 m; u8 qs[16]; }
void dequant_q4_1(const uint8_t* b, float* y) {
  const float d = load_f16(b), m = load_f16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
    y[j + kQK / 2] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// block_q5_0 { f16 d; u8 qh[4]; u8 qs[16]; }
void dequant_q5_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint32_t qh = load_u32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < kQK / 2; ++j) {
    const int xh0 = static_cast<int>(((qh >> j) << 4) & 0x10);
    const int xh1 = static_cast<int>((qh >> (j + 12)) & 0x10);
    y[j] = static_cast<float>(((qs[j] & 0x0F) | xh0) - 16) * d;
    y[j + kQK / 2] = static_cast<float>(((qs[j] >> 4) | xh1) - 16) * d;
  }
}

// block_q5_1 { f16 d; f16 m; u8 qh[4]; u8 qs[16]; }
void dequant_q5_1(const uint8_t* b, float* y) {
  const float d = load_f16(b), m = load_f16(b + 2);
  const uint32_t qh = load_u32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < kQK / 2; ++j) {
    const int xh0 = static_cast<int>(((qh >> j) << 4) & 0x10);
    const int xh1 = static_cast<int>((qh >> (j + 12)) & 0x10);
    y[j] = static_cast<float>((qs[j] & 0x0F) | xh0) * d + m;
    y[j + kQK / 2] = static_cast<float>((qs[j] >> 4) | xh1) * d + m;
  }
}

// block_q8_0 { f16 d; i8 qs[32]; }
void dequant_q8_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

// The 6-bit scale and min of sub-block j, packed in 12 bytes (ggml get_scale_min_k4).
void scale_min_k4(int j, const uint8_t* q, int* d, int* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// block_q2_K { u8 scales[16]; u8 qs[64]; f16 d; f16 dmin; }
void dequant_q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* q = b + 16;
  const float d = load_f16(b + 80), dmin = load_f16(b + 82);
  int is = 0;
  for (int n = 0; n < kQK_K; n += 128) {
    int shift = 0;
    for (int j = 0; j < 4; ++j) {
      for (int half = 0; half < 2; ++half) {
        const uint8_t sc = scales[is++];
        const float dl = d * static_cast<float>(sc & 0x0F), ml = dmin * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l)
          *y++ = dl * static_cast<float>((q[l + 16 * half] >> shift) & 3) - ml;
      }
      shift += 2;
    }
    q += 32;
  }
}

// block_q3_K { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d; }
void dequant_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hm = b;
  const uint8_t* q = b + 32;
  const float d_all = load_f16(b + 108);
  constexpr uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
  uint32_t aux[4] = {load_u32(b + 96), load_u32(b + 100), load_u32(b + 104), 0};
  const uint32_t tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
  aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
  aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
  aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
  int8_t scales[16];
  for (int i = 0; i < 16; ++i)
    scales[i] = static_cast<int8_t>((aux[i / 4] >> (8 * (i % 4))) & 0xFF);
  int is = 0;
  uint8_t m = 1;
  for (int n = 0; n < kQK_K; n += 128) {
    int shift = 0;
    for (int j = 0; j < 4; ++j) {
      for (int half = 0; half < 2; ++half) {
        const float dl = d_all * static_cast<float>(scales[is++] - 32);
        for (int l = 16 * half; l < 16 * half + 16; ++l)
          *y++ = dl * static_cast<float>(((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
      }
      shift += 2;
      m = static_cast<uint8_t>(m << 1);
    }
    q += 32;
  }
}

// block_q4_K { f16 d; f16 dmin; u8 scales[12]; u8 qs[128]; }
void dequant_q4_k(const uint8_t* b, float* y) {
  const float d = load_f16(b), dmin = load_f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  int is = 0;
  for (int j = 0; j < kQK_K; j += 64) {
    int sc, m;
    scale_min_k4(is, scales, &sc, &m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    scale_min_k4(is + 1, scales, &sc, &m);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0F) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    q += 32;
    is += 2;
  }
}

// block_q5_K { f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; }
void dequant_q5_k(const uint8_t* b, float* y) {
  const float d = load_f16(b), dmin = load_f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  int is = 0;
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0; j < kQK_K; j += 64) {
    int sc, m;
    scale_min_k4(is, scales, &sc, &m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    scale_min_k4(is + 1, scales, &sc, &m);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l)
      *y++ = d1 * static_cast<float>((ql[l] & 0x0F) + ((qh[l] & u1) ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l)
      *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
    ql += 32;
    is += 2;
    u1 = static_cast<uint8_t>(u1 << 2);
    u2 = static_cast<uint8_t>(u2 << 2);
  }
}

// block_q6_K { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d; }
void dequant_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = load_f16(b + 208);
  for (int n = 0; n < kQK_K; n += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

}  // namespace

std::string ggml_type_name(uint32_t t) {
  switch (t) {
    case kGgmlF32:
      return "F32";
    case kGgmlF16:
      return "F16";
    case kGgmlQ4_0:
      return "Q4_0";
    case kGgmlQ4_1:
      return "Q4_1";
    case kGgmlQ5_0:
      return "Q5_0";
    case kGgmlQ5_1:
      return "Q5_1";
    case kGgmlQ8_0:
      return "Q8_0";
    case kGgmlQ8_1:
      return "Q8_1";
    case kGgmlQ2_K:
      return "Q2_K";
    case kGgmlQ3_K:
      return "Q3_K";
    case kGgmlQ4_K:
      return "Q4_K";
    case kGgmlQ5_K:
      return "Q5_K";
    case kGgmlQ6_K:
      return "Q6_K";
    case kGgmlQ8_K:
      return "Q8_K";
    case kGgmlI8:
      return "I8";
    case kGgmlI16:
      return "I16";
    case kGgmlI32:
      return "I32";
    case kGgmlI64:
      return "I64";
    case kGgmlF64:
      return "F64";
    case kGgmlBF16:
      return "BF16";
  }
  return "type" + std::to_string(t);
}

bool ggml_type_block(uint32_t t, int64_t* block_elems, int64_t* block_bytes) {
  struct Geometry {
    uint32_t type;
    int64_t elems, bytes;
  };
  static constexpr Geometry kTable[] = {
      {kGgmlF32, 1, 4},        {kGgmlF16, 1, 2},        {kGgmlBF16, 1, 2},
      {kGgmlQ4_0, kQK, 18},    {kGgmlQ4_1, kQK, 20},    {kGgmlQ5_0, kQK, 22},
      {kGgmlQ5_1, kQK, 24},    {kGgmlQ8_0, kQK, 34},    {kGgmlQ2_K, kQK_K, 84},
      {kGgmlQ3_K, kQK_K, 110}, {kGgmlQ4_K, kQK_K, 144}, {kGgmlQ5_K, kQK_K, 176},
      {kGgmlQ6_K, kQK_K, 210}, {kGgmlI8, 1, 1},         {kGgmlI16, 1, 2},
      {kGgmlI32, 1, 4},        {kGgmlI64, 1, 8},        {kGgmlF64, 1, 8},
  };
  for (const Geometry& g : kTable) {
    if (g.type != t) continue;
    *block_elems = g.elems;
    *block_bytes = g.bytes;
    return true;
  }
  return false;
}

bool ggml_can_dequantize(uint32_t t) {
  switch (t) {
    case kGgmlF32:
    case kGgmlF16:
    case kGgmlBF16:
    case kGgmlQ4_0:
    case kGgmlQ4_1:
    case kGgmlQ5_0:
    case kGgmlQ5_1:
    case kGgmlQ8_0:
    case kGgmlQ2_K:
    case kGgmlQ3_K:
    case kGgmlQ4_K:
    case kGgmlQ5_K:
    case kGgmlQ6_K:
      return true;
    default:
      return false;
  }
}

void ggml_dequantize(uint32_t t, const uint8_t* src, int64_t count, float* dst) {
  int64_t be = 0, bb = 0;
  if (!ggml_type_block(t, &be, &bb))
    throw_error(ErrorCode::kUnsupported, "ggml type " + ggml_type_name(t) + " is not supported");
  ARBOR_CHECK(count % be == 0, "element count is not a multiple of the block size");
  const int64_t blocks = count / be;
  void (*block_fn)(const uint8_t*, float*) = nullptr;
  switch (t) {
    case kGgmlF32:
      for (int64_t i = 0; i < count; ++i) dst[i] = load_f32(src + 4 * i);
      return;
    case kGgmlF16:
      for (int64_t i = 0; i < count; ++i) dst[i] = load_f16(src + 2 * i);
      return;
    case kGgmlBF16:
      for (int64_t i = 0; i < count; ++i) dst[i] = bf16_to_f32(load_u16(src + 2 * i));
      return;
    case kGgmlQ8_0:
      block_fn = dequant_q8_0;
      break;
    case kGgmlQ4_0:
      block_fn = dequant_q4_0;
      break;
    case kGgmlQ4_1:
      block_fn = dequant_q4_1;
      break;
    case kGgmlQ5_0:
      block_fn = dequant_q5_0;
      break;
    case kGgmlQ5_1:
      block_fn = dequant_q5_1;
      break;
    case kGgmlQ2_K:
      block_fn = dequant_q2_k;
      break;
    case kGgmlQ3_K:
      block_fn = dequant_q3_k;
      break;
    case kGgmlQ4_K:
      block_fn = dequant_q4_k;
      break;
    case kGgmlQ5_K:
      block_fn = dequant_q5_k;
      break;
    case kGgmlQ6_K:
      block_fn = dequant_q6_k;
      break;
    default:
      throw_error(ErrorCode::kUnsupported,
                  "ggml type " + ggml_type_name(t) + " cannot be converted to fp32");
  }
  for (int64_t i = 0; i < blocks; ++i) block_fn(src + bb * i, dst + be * i);
}

}  // namespace arbor
