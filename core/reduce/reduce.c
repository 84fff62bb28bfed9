/*
 * Chooses which compiled variant of the reduction kernels runs. The choice is
 * made once, on first use: SMDDP_SIMD if it names an instruction set this
 * build and CPU support, else the widest one that they do (AVX-512, AVX2,
 * portable C). Tests switch variants with smddp__reduce_set_isa() to check
 * that they agree bit for bit.
 */
#include <assert.h>
#include <strings.h>

#include "param.h"
#include "reduce.h"
#include "reduce/reduce_isa_config.h"
#include "reduce_isa.h"

typedef void (*reduce_fn_t)(const smddp__reduce_spec_t *spec, void *dst,
                            const void *const *srcs, int nsrc, size_t count);

/* Indexed like SMDDP_SIMD's choices after "auto": 1 scalar, 2 avx2, 3 avx512. */
typedef enum reduce_isa { ISA_SCALAR, ISA_AVX2, ISA_AVX512, ISA_COUNT } reduce_isa_t;

static const struct {
    const char *name;
    reduce_fn_t fn; /* NULL when this build has no such variant */
} isas[ISA_COUNT] = {
    [ISA_SCALAR] = {"scalar", smddp__reduce_generic},
#if SMDDP_REDUCE_HAVE_AVX2
    [ISA_AVX2] = {"avx2", smddp__reduce_avx2},
#else
    [ISA_AVX2] = {"avx2", NULL},
#endif
#if SMDDP_REDUCE_HAVE_AVX512
    [ISA_AVX512] = {"avx512", smddp__reduce_avx512},
#else
    [ISA_AVX512] = {"avx512", NULL},
#endif
};

/* The variant in use, or -1 before the first call chooses one. */
static int active_isa = -1;

static bool cpu_has(reduce_isa_t isa)
{
    if (!isas[isa].fn) return false;
#if SMDDP_REDUCE_HAVE_AVX2 || SMDDP_REDUCE_HAVE_AVX512
    /* These also check that the OS saves the YMM/ZMM registers (XGETBV). */
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    switch (isa) {
    case ISA_AVX2:
        return avx2;
    case ISA_AVX512:
        return avx2 && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512dq");
    default:
        break;
    }
#endif
    return isa == ISA_SCALAR;
}

static reduce_isa_t best_isa(void)
{
    for (int isa = ISA_COUNT - 1; isa > ISA_SCALAR; isa--)
        if (cpu_has((reduce_isa_t)isa)) return (reduce_isa_t)isa;
    return ISA_SCALAR;
}

/* First use: SMDDP_SIMD, else the best; a racing set_isa() wins. */
static int init_isa(void)
{
    int want = best_isa();
    int simd = (int)smddp__params()->simd; /* SMDDP_SIMD_AUTO, else ISA index + 1 */
    if (simd > 0 && simd <= ISA_COUNT) {
        if (cpu_has((reduce_isa_t)(simd - 1)))
            want = simd - 1;
        else
            SMDDP_WARN("SMDDP_SIMD=%s is not supported by this CPU or build; using %s",
                       isas[simd - 1].name, isas[want].name);
    }
    int expected = -1;
    if (!__atomic_compare_exchange_n(&active_isa, &expected, want, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return expected;
    SMDDP_INFO("reduction kernels: %s", isas[want].name);
    return want;
}

static inline int current_isa(void)
{
    int isa = __atomic_load_n(&active_isa, __ATOMIC_ACQUIRE);
    return isa >= 0 ? isa : init_isa();
}

bool smddp__reduce_valid(smddp_dtype_t dtype, smddp_op_t op)
{
    if ((unsigned)dtype >= SMDDP_DTYPE_COUNT || (unsigned)op >= SMDDP_OP_COUNT) return false;
    bool is_float = dtype == SMDDP_FLOAT16 || dtype == SMDDP_BFLOAT16 ||
                    dtype == SMDDP_FLOAT32 || dtype == SMDDP_FLOAT64;
    switch (op) {
    case SMDDP_PREMUL_SUM: return is_float;
    case SMDDP_BAND:
    case SMDDP_BOR:
    case SMDDP_BXOR: return !is_float;
    default: return true;
    }
}

void smddp__reduce(const smddp__reduce_spec_t *spec, void *dst, const void *const *srcs,
                   int nsrc, size_t count)
{
    assert(spec && smddp__reduce_valid(spec->dtype, spec->op) && nsrc >= 1);
    if (count == 0) return;
    isas[current_isa()].fn(spec, dst, srcs, nsrc, count);
}

const char *smddp__reduce_isa(void) { return isas[current_isa()].name; }

smddp_status_t smddp__reduce_set_isa(const char *isa)
{
    if (!isa) return smddp__error_quiet(SMDDP_ERR_INVALID_ARGUMENT, "reduce ISA is NULL");
    int want = -1;
    if (strcasecmp(isa, "auto") == 0) {
        want = best_isa();
    } else {
        for (int i = 0; i < ISA_COUNT; i++)
            if (strcasecmp(isa, isas[i].name) == 0) want = i;
        if (want < 0)
            return smddp__error_quiet(SMDDP_ERR_INVALID_ARGUMENT,
                                      "unknown reduce ISA '%s' (auto, scalar, avx2, avx512)",
                                      isa);
        if (!cpu_has((reduce_isa_t)want))
            return smddp__error_quiet(SMDDP_ERR_NOT_SUPPORTED,
                                      "reduce ISA '%s' is not supported by this %s", isa,
                                      isas[want].fn ? "CPU" : "build");
    }
    __atomic_store_n(&active_isa, want, __ATOMIC_RELEASE);
    return SMDDP_OK;
}
