/* f16 (IEEE 754 binary16) and bf16 (bfloat16) <-> f32 conversions, written
 * once in the common subset of C, CUDA C++ and OpenCL C, so every backend
 * produces the same bits: devices/cpu/ and devices/cuda/ include this file,
 * cmake/embed_cl.cmake embeds it into the OpenCL program (after
 * devices/ew_math.h).
 *
 * Before including, a backend defines
 *   EW_FN              the qualifiers of a helper (as for devices/ew_math.h)
 *   em_u32, em_u16     32- and 16-bit unsigned integer types
 *   EM_F2U(f), EM_U2F(u)  the bits of a float as em_u32, and back
 *
 * Semantics (bit-exact with PyTorch's CPU casts, c10/util/Half.h and
 * c10/util/BFloat16.h; checked by tests/test_half.c against fixtures made by
 * tests/fixtures/gen_half_fixtures.py):
 *   f32 -> f16   round to nearest, ties to even, subnormals kept, values
 *                >= 65520 in magnitude become infinity, NaN becomes the
 *                quiet NaN 0x7e00 with the input's sign.
 *   f32 -> bf16  round to nearest, ties to even (the top 16 bits after adding
 *                0x7fff plus the lowest kept bit); NaN becomes 0x7fc0.
 *   f16/bf16 -> f32  exact (NaN payloads kept).
 * Other dtypes go through f32 (f64 -> f16 rounds to f32 first, as PyTorch). */
#ifndef EMBER_HALF_H
#define EMBER_HALF_H

EW_FN em_u16 em_f32_to_f16_bits(float f)
{
    em_u32 w = EM_F2U(f);
    em_u16 sign = (em_u16)((w >> 16) & 0x8000u);
    em_u32 x = w & 0x7fffffffu;
    if (x > 0x7f800000u) return (em_u16)(sign | 0x7e00u);  /* NaN */
    if (x >= 0x477ff000u) return (em_u16)(sign | 0x7c00u); /* >= 65520 (and inf): infinity */
    if (x >= 0x38800000u) {                                 /* a normal half: rebias, round the 13 dropped bits */
        x += 0xfffu + ((x >> 13) & 1u);
        return (em_u16)(sign | ((x - 0x38000000u) >> 13));
    }
    if (x < 0x33000000u) return sign; /* below 2^-25: zero (2^-25 itself is a tie to 0) */
    /* subnormal half: the value in units of 2^-24, rounded to nearest even */
    em_u32 e = x >> 23, m = (x & 0x7fffffu) | 0x800000u;
    em_u32 shift = 126u - e; /* 14 .. 24 */
    em_u32 r = m >> shift, rem = m & ((1u << shift) - 1u), tie = 1u << (shift - 1u); /* not "half": a type in OpenCL C */
    if (rem > tie || (rem == tie && (r & 1u))) r++;
    return (em_u16)(sign | r);
}

EW_FN float em_f16_bits_to_f32(em_u16 h)
{
    em_u32 sign = ((em_u32)h & 0x8000u) << 16;
    em_u32 e = ((em_u32)h >> 10) & 0x1fu, m = (em_u32)h & 0x3ffu;
    if (e == 31u) return EM_U2F(sign | 0x7f800000u | (m << 13));
    if (e != 0u) return EM_U2F(sign | ((e + 112u) << 23) | (m << 13));
    if (m == 0u) return EM_U2F(sign);
    e = 113u; /* subnormal: normalise */
    while (!(m & 0x400u)) {
        m <<= 1;
        e--;
    }
    return EM_U2F(sign | (e << 23) | ((m & 0x3ffu) << 13));
}

EW_FN em_u16 em_f32_to_bf16_bits(float f)
{
    em_u32 w = EM_F2U(f);
    if ((w & 0x7fffffffu) > 0x7f800000u) return (em_u16)0x7fc0u;
    return (em_u16)((w + 0x7fffu + ((w >> 16) & 1u)) >> 16);
}

EW_FN float em_bf16_bits_to_f32(em_u16 h) { return EM_U2F((em_u32)h << 16); }

#endif
