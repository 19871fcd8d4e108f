/*
 * One column block of the CPU GEMM for the ISA named by KVF_GEMM_ISA (512 or
 * 256), included by kvf_gemm_cpu.c under that ISA's target pragma; uses its
 * kvf_g<ISA>_4x4 / _1x8 register tiles. Rows in tiles of 4, the rows left
 * over one at a time; every element's arithmetic is the same in both
 * (kvf_gemm_cpu.c). Not a header of its own: no include guard.
 */
#define KVF_GB_CAT2(_a, _b) _a##_b
#define KVF_GB_CAT(_a, _b) KVF_GB_CAT2(_a, _b)
#define KVF_GB(_name) KVF_GB_CAT(KVF_GB_CAT(kvf_g, KVF_GEMM_ISA), _name)

static inline __attribute__((always_inline)) void
KVF_GB(_block_w)(const kvf_gemm_job_t *j, int n0, int n1, int wbf)
{
    int m = 0;

    for (; m + 4 <= j->M; m += 4) {
        const float *xr[4];
        for (int a = 0; a < 4; ++a) {
            xr[a] = j->x + (size_t)(m + a) * j->ldx;
        }
        for (int n = n0; n < n1; n += 4) {
            const int nr = (n1 - n < 4) ? n1 - n : 4;
            size_t wc[4];
            float d[4][4];
            for (int b = 0; b < 4; ++b) {
                wc[b] = (size_t)(n + ((b < nr) ? b : 0)) * j->ldw;
            }
            KVF_GB(_4x4)(j->K, xr, j->w, wbf, wc, d);
            for (int a = 0; a < 4; ++a) {
                for (int b = 0; b < nr; ++b) {
                    kvf_gemm_put(j, m + a, n + b, d[a][b]);
                }
            }
        }
    }
    for (; m < j->M; ++m) {
        const float *xr = j->x + (size_t)m * j->ldx;
        for (int n = n0; n < n1; n += 8) {
            const int nr = (n1 - n < 8) ? n1 - n : 8;
            size_t wc[8];
            float d[8];
            for (int b = 0; b < 8; ++b) {
                wc[b] = (size_t)(n + ((b < nr) ? b : 0)) * j->ldw;
            }
            KVF_GB(_1x8)(j->K, xr, j->w, wbf, wc, d);
            for (int b = 0; b < nr; ++b) {
                kvf_gemm_put(j, m, n + b, d[b]);
            }
        }
    }
}

static void KVF_GB_CAT(kvf_gemm_block_, KVF_GEMM_ISA)(const kvf_gemm_job_t *j, int n0, int n1)
{
    if (j->wbf) {
        KVF_GB(_block_w)(j, n0, n1, 1);
    } else {
        KVF_GB(_block_w)(j, n0, n1, 0);
    }
}

#undef KVF_GB
#undef KVF_GB_CAT
#undef KVF_GB_CAT2
