/* Philox4x32-10 counter-based random numbers (Salmon, Moraes, Dror, Shaw,
 * "Parallel random numbers: as easy as 1, 2, 3", SC 2011; constants from the
 * Random123 reference implementation). Element i of a draw uses counter
 * (offset + i, 0, 0) under the 64-bit seed as key, so results do not depend
 * on the device or on how the work is split into tiles. Header-only so CPU,
 * CUDA and OpenCL kernels share the exact same arithmetic. */
#ifndef EMBER_PHILOX_H
#define EMBER_PHILOX_H

#include <stdint.h>

#ifdef __CUDACC__
#define EM_PHILOX_FN static __host__ __device__ inline
#else
#define EM_PHILOX_FN static inline
#endif

EM_PHILOX_FN void em_philox4x32_10(uint64_t counter, uint64_t seed, uint32_t out[4])
{
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* Uniform in [0, 1) with 24 random bits (exactly representable in float). */
EM_PHILOX_FN double em_philox_u01(uint32_t x) { return (double)(x >> 8) * (1.0 / 16777216.0); }

/* Uniform in (0, 1] for logarithms. */
EM_PHILOX_FN double em_philox_u01_open0(uint32_t x) { return ((double)(x >> 8) + 1.0) * (1.0 / 16777216.0); }

#endif
