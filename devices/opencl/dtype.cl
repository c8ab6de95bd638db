/* Loads and stores through a runtime dtype (uniform branches), shared by the
 * element-wise copy and the reductions. Embedded right after devices/half.h
 * (CMakeLists.txt), whose converters the f16 / bf16 cases use: a 16-bit
 * element is loaded as ushort and widened exactly, a value is stored
 * through float rounded to nearest even, as the CPU's copy (store_d of
 * devices/cpu/elementwise.c: f64 -> f16 rounds to f32 first). */

inline float em_half_ld(int dt, ushort h) { return dt == EM_DT_BF16 ? em_bf16_bits_to_f32(h) : em_f16_bits_to_f32(h); }
inline ushort em_half_st(int dt, float v) { return dt == EM_DT_BF16 ? em_f32_to_bf16_bits(v) : em_f32_to_f16_bits(v); }

inline acc_t em_ld_acc(int dt, __global const uchar *b, long i)
{
    switch (dt) {
    case EM_DT_F32: return (acc_t)((__global const float *)b)[i];
#ifdef EM_FP64
    case EM_DT_F64: return ((__global const double *)b)[i];
#endif
    case EM_DT_I32: return (acc_t)((__global const int *)b)[i];
    case EM_DT_I64: return (acc_t)((__global const long *)b)[i];
    case EM_DT_F16:
    case EM_DT_BF16: return (acc_t)em_half_ld(dt, ((__global const ushort *)b)[i]);
    default: return (acc_t)b[i];
    }
}

/* As the CPU's ldi: floats truncate toward zero. */
inline long em_ld_long(int dt, __global const uchar *b, long i)
{
    switch (dt) {
    case EM_DT_I32: return ((__global const int *)b)[i];
    case EM_DT_I64: return ((__global const long *)b)[i];
    case EM_DT_F32: return (long)((__global const float *)b)[i];
#ifdef EM_FP64
    case EM_DT_F64: return (long)((__global const double *)b)[i];
#endif
    case EM_DT_F16:
    case EM_DT_BF16: return (long)em_half_ld(dt, ((__global const ushort *)b)[i]);
    default: return b[i];
    }
}

/* As the CPU reduce's st(): use_i picks the integer value. */
inline void em_st_val(int dt, __global uchar *b, long i, acc_t v, long iv, int use_i)
{
    switch (dt) {
    case EM_DT_F32: ((__global float *)b)[i] = (float)v; break;
#ifdef EM_FP64
    case EM_DT_F64: ((__global double *)b)[i] = v; break;
#endif
    case EM_DT_I32: ((__global int *)b)[i] = use_i ? (int)iv : (int)v; break;
    case EM_DT_I64: ((__global long *)b)[i] = use_i ? iv : (long)v; break;
    case EM_DT_U8: b[i] = use_i ? (uchar)iv : (uchar)(long)v; break;
    case EM_DT_F16:
    case EM_DT_BF16: ((__global ushort *)b)[i] = em_half_st(dt, use_i ? (float)iv : (float)v); break;
    default: b[i] = use_i ? (iv != 0) : (v != 0); break;
    }
}

inline int em_dt_is_int(int dt) { return dt == EM_DT_I32 || dt == EM_DT_I64 || dt == EM_DT_U8 || dt == EM_DT_BOOL; }

/* Size in bytes of one element of dt. */
inline int em_dt_size(int dt)
{
    return (dt == EM_DT_F64 || dt == EM_DT_I64) ? 8 : (dt == EM_DT_U8 || dt == EM_DT_BOOL) ? 1 : (dt == EM_DT_F16 || dt == EM_DT_BF16) ? 2 : 4;
}
