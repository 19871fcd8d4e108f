/*
 * Model test helpers and the reference forward.
 *
 * The reference is deliberately naive: whole-sequence matrices, a direct
 * causal conv, a sequential scan, dense causal softmax attention, all in
 * double, weights read whole from the checkpoint (no sharding, no pages, no
 * kernels/). It follows HF modeling_nemotron_h.py torch_forward.
 */
#include "kvf_model_test_util.h"
#include "kvf_mkmodel.h"
#include "kvf_safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

void kvf_test_mkmodel(const char *name, uint64_t seed, char *dir)
{
    char cfg[1024];
    snprintf(dir, 256, "/tmp/kvf-model-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(cfg, sizeof(cfg), "%s/tests/data/models/%s.config.json", KVF_SOURCE_DIR, name);
    assert_int_equal(kvf_mkmodel_write(cfg, dir, seed, KVF_DTYPE_FP32), KVF_OK);
}

void kvf_test_rmmodel(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[1024];

    while ((d != NULL) && ((e = readdir(d)) != NULL)) {
        if (e->d_name[0] != '.') {
            snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
            unlink(p);
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    rmdir(dir);
}

kvf_test_engine_opts_t kvf_test_engine_defaults(void)
{
    kvf_test_engine_opts_t o = {0};
    o.tp = 1;
    o.kv_dtype = o.ssm_dtype = o.conv_dtype = KVF_DTYPE_FP32;
    return o;
}

kvf_engine_h kvf_test_engine(const char *dir, const kvf_test_engine_opts_t *o)
{
    kvf_engine_params_t ep = {0};
    kvf_model_config_t cfg;
    kvf_engine_h eng = NULL;

    assert_int_equal(kvf_model_config_load(dir, &cfg), KVF_OK);
    kvf_cache_params_default(&cfg, &ep.cache);
    ep.cache.kv_dtype = o->kv_dtype;
    ep.cache.ssm_dtype = o->ssm_dtype;
    ep.cache.conv_dtype = o->conv_dtype;
    ep.cache.block_size = o->block_size;
    ep.cache.kv_layout = o->kv_layout;
    if (o->kernel_block > 0) {
        memset(&ep.cache.kernel_sizes, 0, sizeof(ep.cache.kernel_sizes));
        ep.cache.kernel_sizes.num_exact = 1;
        ep.cache.kernel_sizes.exact[0] = o->kernel_block;
    }
    ep.field_mask = KVF_ENGINE_PARAM_FIELD_CACHE;
    ep.model_dir = dir;
    ep.tp_size = o->tp;
    if (o->num_blocks > 0) {
        ep.field_mask |= KVF_ENGINE_PARAM_FIELD_NUM_BLOCKS;
        ep.num_blocks = o->num_blocks;
    }
    if (o->max_batch_tokens > 0) {
        ep.field_mask |= KVF_ENGINE_PARAM_FIELD_MAX_BATCH_TOKENS;
        ep.max_batch_tokens = o->max_batch_tokens;
    }
    if (o->pool_alloc != NULL) {
        ep.field_mask |= KVF_ENGINE_PARAM_FIELD_POOL_ALLOC;
        ep.pool_alloc = o->pool_alloc;
        ep.pool_alloc_ctx = o->pool_alloc_ctx;
    }
    if (o->max_seqs > 0) {
        ep.field_mask |= KVF_ENGINE_PARAM_FIELD_MAX_SEQS;
        ep.max_seqs = o->max_seqs;
    }
    if (o->no_zero) {
        ep.field_mask |= KVF_ENGINE_PARAM_FIELD_NO_ZERO;
        ep.disable_zeroing = true;
    }
    assert_int_equal(kvf_engine_create(&ep, &eng), KVF_OK);
    return eng;
}

void kvf_test_greedy(kvf_engine_h eng, const int32_t *prompt, int n, int max_tokens,
                     int32_t *out_tokens, float *out_logits)
{
    const int vocab = kvf_engine_model_config(eng)->vocab_size;
    kvf_req_params_t rp = {0};
    kvf_engine_event_t ev[256];
    kvf_req_info_t info;
    uint64_t id;
    int ne, guard = 0;

    rp.prompt = prompt;
    rp.prompt_len = n;
    rp.sampling.max_tokens = max_tokens;
    rp.sampling.ignore_eos = true;
    rp.record_logits = (out_logits != NULL);
    assert_int_equal(kvf_engine_add_request(eng, &rp, &id), KVF_OK);
    while (kvf_engine_has_work(eng)) {
        assert_int_equal(kvf_engine_step(eng, ev, 256, &ne), KVF_OK);
        assert_true(++guard < 100000);
    }
    assert_int_equal(kvf_engine_request_info(eng, id, &info), KVF_OK);
    assert_int_equal(info.state, KVF_REQ_FINISHED);
    assert_int_equal(info.num_tokens - info.prompt_len, max_tokens);
    memcpy(out_tokens, info.tokens + info.prompt_len, (size_t)max_tokens * sizeof(int32_t));
    if (out_logits != NULL) {
        assert_int_equal(info.num_logits, max_tokens);
        memcpy(out_logits, info.logits, (size_t)max_tokens * (size_t)vocab * sizeof(float));
    }
    assert_int_equal(kvf_engine_release(eng, id), KVF_OK);
}

int kvf_test_prompt(const char *text, int32_t *ids, int cap)
{
    int n = 0;
    assert_true((int)strlen(text) + 1 <= cap);
    ids[n++] = 256;   /* BOS of the tiny configs */
    for (const char *p = text; *p != '\0'; ++p) {
        ids[n++] = (unsigned char)*p;
    }
    return n;
}

double kvf_test_rel_diff(const float *a, const float *b, int n)
{
    double maxd = 0.0, maxb = 1.0;
    for (int i = 0; i < n; ++i) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= maxd)) {
            maxd = d;   /* NaN propagates */
        }
        if (fabs((double)b[i]) > maxb) {
            maxb = fabs((double)b[i]);
        }
    }
    return maxd / maxb;
}

/* ---- reference forward ------------------------------------------------------ */

static double *kvf_ref_load(kvf_st_file_h st, const char *name, int ndim, const int64_t *shape)
{
    size_t n = 1;
    float *f;
    double *d;
    for (int i = 0; i < ndim; ++i) {
        n *= (size_t)shape[i];
    }
    f = malloc(n * sizeof(float));
    d = malloc(n * sizeof(double));
    assert_non_null(f);
    assert_non_null(d);
    assert_int_equal(kvf_st_load_f32(st, name, ndim, shape, f), KVF_OK);
    for (size_t i = 0; i < n; ++i) {
        d[i] = f[i];
    }
    free(f);
    return d;
}

static double *kvf_ref_w(kvf_st_file_h st, int layer, const char *suffix, int ndim, int64_t d0,
                         int64_t d1, int64_t d2)
{
    char name[256];
    const int64_t shape[3] = {d0, d1, d2};
    snprintf(name, sizeof(name), "backbone.layers.%d.%s", layer, suffix);
    return kvf_ref_load(st, name, ndim, shape);
}

/* y[L][N] = x[L][K] W[N][K]^T */
static void kvf_ref_linear(const double *x, const double *w, int L, int N, int K, double *y)
{
    for (int t = 0; t < L; ++t) {
        for (int o = 0; o < N; ++o) {
            double s = 0.0;
            for (int k = 0; k < K; ++k) {
                s += x[(size_t)t * K + k] * w[(size_t)o * K + k];
            }
            y[(size_t)t * N + o] = s;
        }
    }
}

static void kvf_ref_rmsnorm(const double *x, const double *w, int L, int H, double eps, double *y)
{
    for (int t = 0; t < L; ++t) {
        double ss = 0.0;
        for (int i = 0; i < H; ++i) {
            ss += x[(size_t)t * H + i] * x[(size_t)t * H + i];
        }
        double r = 1.0 / sqrt(ss / H + eps);
        for (int i = 0; i < H; ++i) {
            y[(size_t)t * H + i] = x[(size_t)t * H + i] * r * w[i];
        }
    }
}

static double kvf_silu(double v)
{
    return v / (1.0 + exp(-v));
}

static void kvf_ref_mamba(kvf_st_file_h st, const kvf_model_config_t *c, int l, const double *x,
                          int L, double *out)
{
    const int H = c->hidden_size, nh = c->mamba_num_heads, hd = c->mamba_head_dim;
    const int N = c->ssm_state_size, G = c->n_groups, K = c->conv_kernel;
    const int inner = nh * hd, cd = inner + 2 * G * N, P = inner + cd + nh;
    double *in_w = kvf_ref_w(st, l, "mixer.in_proj.weight", 2, P, H, 0);
    double *cw = kvf_ref_w(st, l, "mixer.conv1d.weight", 3, cd, 1, K);
    double *cb = kvf_ref_w(st, l, "mixer.conv1d.bias", 1, cd, 0, 0);
    double *dtb = kvf_ref_w(st, l, "mixer.dt_bias", 1, nh, 0, 0);
    double *alog = kvf_ref_w(st, l, "mixer.A_log", 1, nh, 0, 0);
    double *D = kvf_ref_w(st, l, "mixer.D", 1, nh, 0, 0);
    double *nw = kvf_ref_w(st, l, "mixer.norm.weight", 1, inner, 0, 0);
    double *ow = kvf_ref_w(st, l, "mixer.out_proj.weight", 2, H, inner, 0);
    double *proj = calloc((size_t)L * P, sizeof(double));
    double *xbc = calloc((size_t)L * cd, sizeof(double));
    double *y = calloc((size_t)L * inner, sizeof(double));
    double *S = calloc((size_t)nh * hd * N, sizeof(double));

    kvf_ref_linear(x, in_w, L, P, H, proj);
    for (int t = 0; t < L; ++t) {                 /* causal depthwise conv + SiLU */
        for (int ch = 0; ch < cd; ++ch) {
            double s = cb[ch];
            for (int k = 0; k < K; ++k) {
                int src = t - (K - 1) + k;
                if (src >= 0) {
                    s += cw[(size_t)ch * K + k] * proj[(size_t)src * P + inner + ch];
                }
            }
            xbc[(size_t)t * cd + ch] = kvf_silu(s);
        }
    }
    for (int t = 0; t < L; ++t) {                 /* selective scan */
        for (int h = 0; h < nh; ++h) {
            int g = h / (nh / G);
            double v = proj[(size_t)t * P + inner + cd + h] + dtb[h];
            double dt = (v > 20.0) ? v : log1p(exp(v));
            double dA = exp(-dt * exp(alog[h]));
            for (int p = 0; p < hd; ++p) {
                double xv = xbc[(size_t)t * cd + h * hd + p], acc = 0.0;
                for (int n = 0; n < N; ++n) {
                    double *s = &S[((size_t)h * hd + p) * N + n];
                    *s = *s * dA + dt * xv * xbc[(size_t)t * cd + inner + g * N + n];
                    acc += *s * xbc[(size_t)t * cd + inner + G * N + g * N + n];
                }
                y[(size_t)t * inner + h * hd + p] = acc + D[h] * xv;
            }
        }
    }
    for (int t = 0; t < L; ++t) {                 /* gated grouped RMSNorm */
        int gs = inner / G;
        for (int i = 0; i < inner; ++i) {
            y[(size_t)t * inner + i] *= kvf_silu(proj[(size_t)t * P + i]);
        }
        for (int g = 0; g < G; ++g) {
            double ss = 0.0;
            for (int i = g * gs; i < (g + 1) * gs; ++i) {
                ss += y[(size_t)t * inner + i] * y[(size_t)t * inner + i];
            }
            double r = 1.0 / sqrt(ss / gs + c->norm_eps);
            for (int i = g * gs; i < (g + 1) * gs; ++i) {
                y[(size_t)t * inner + i] *= r * nw[i];
            }
        }
    }
    kvf_ref_linear(y, ow, L, H, inner, out);
    free(in_w); free(cw); free(cb); free(dtb); free(alog); free(D); free(nw); free(ow);
    free(proj); free(xbc); free(y); free(S);
}

static void kvf_ref_attention(kvf_st_file_h st, const kvf_model_config_t *c, int l,
                              const double *x, int L, double *out)
{
    const int H = c->hidden_size, nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    const int hd = c->head_dim;
    double *wq = kvf_ref_w(st, l, "mixer.q_proj.weight", 2, nh * hd, H, 0);
    double *wk = kvf_ref_w(st, l, "mixer.k_proj.weight", 2, nkv * hd, H, 0);
    double *wv = kvf_ref_w(st, l, "mixer.v_proj.weight", 2, nkv * hd, H, 0);
    double *wo = kvf_ref_w(st, l, "mixer.o_proj.weight", 2, H, nh * hd, 0);
    double *q = calloc((size_t)L * nh * hd, sizeof(double));
    double *k = calloc((size_t)L * nkv * hd, sizeof(double));
    double *v = calloc((size_t)L * nkv * hd, sizeof(double));
    double *a = calloc((size_t)L * nh * hd, sizeof(double));
    double *p = calloc((size_t)L, sizeof(double));
    const double scale = 1.0 / sqrt((double)hd);

    kvf_ref_linear(x, wq, L, nh * hd, H, q);
    kvf_ref_linear(x, wk, L, nkv * hd, H, k);
    kvf_ref_linear(x, wv, L, nkv * hd, H, v);
    for (int t = 0; t < L; ++t) {
        for (int h = 0; h < nh; ++h) {
            int kh = h / (nh / nkv);
            double m = -INFINITY, sum = 0.0;
            for (int s = 0; s <= t; ++s) {
                double d = 0.0;
                for (int i = 0; i < hd; ++i) {
                    d += q[((size_t)t * nh + h) * hd + i] * k[((size_t)s * nkv + kh) * hd + i];
                }
                p[s] = d * scale;
                m = (p[s] > m) ? p[s] : m;
            }
            for (int s = 0; s <= t; ++s) {
                p[s] = exp(p[s] - m);
                sum += p[s];
            }
            for (int i = 0; i < hd; ++i) {
                double acc = 0.0;
                for (int s = 0; s <= t; ++s) {
                    acc += p[s] * v[((size_t)s * nkv + kh) * hd + i];
                }
                a[((size_t)t * nh + h) * hd + i] = acc / sum;
            }
        }
    }
    kvf_ref_linear(a, wo, L, H, nh * hd, out);
    free(wq); free(wk); free(wv); free(wo); free(q); free(k); free(v); free(a); free(p);
}

static void kvf_ref_mlp(kvf_st_file_h st, const kvf_model_config_t *c, int l, const double *x,
                        int L, double *out)
{
    const int H = c->hidden_size, I = c->intermediate_size;
    double *up = kvf_ref_w(st, l, "mixer.up_proj.weight", 2, I, H, 0);
    double *down = kvf_ref_w(st, l, "mixer.down_proj.weight", 2, H, I, 0);
    double *u = calloc((size_t)L * I, sizeof(double));

    kvf_ref_linear(x, up, L, I, H, u);
    for (size_t i = 0; i < (size_t)L * I; ++i) {
        u[i] = (u[i] > 0.0) ? u[i] * u[i] : 0.0;
    }
    kvf_ref_linear(u, down, L, H, I, out);
    free(up); free(down); free(u);
}

void kvf_ref_forward(const char *dir, const int32_t *tokens, int L, float *logits)
{
    kvf_model_config_t c;
    kvf_st_file_h st;
    char path[512];

    assert_int_equal(kvf_model_config_load(dir, &c), KVF_OK);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    assert_int_equal(kvf_st_open(path, &st), KVF_OK);

    const int H = c.hidden_size, V = c.vocab_size;
    const int64_t vh[2] = {V, H}, hs[1] = {H};
    double *emb = kvf_ref_load(st, "backbone.embeddings.weight", 2, vh);
    double *h = calloc((size_t)L * H, sizeof(double));
    double *xn = calloc((size_t)L * H, sizeof(double));
    double *o = calloc((size_t)L * H, sizeof(double));

    for (int t = 0; t < L; ++t) {
        memcpy(h + (size_t)t * H, emb + (size_t)tokens[t] * H, (size_t)H * sizeof(double));
    }
    for (int l = 0; l < c.num_layers; ++l) {
        double *nw = kvf_ref_w(st, l, "norm.weight", 1, H, 0, 0);
        kvf_ref_rmsnorm(h, nw, L, H, c.norm_eps, xn);
        free(nw);
        switch (c.layer_kinds[l]) {
        case 'M': kvf_ref_mamba(st, &c, l, xn, L, o); break;
        case '*': kvf_ref_attention(st, &c, l, xn, L, o); break;
        default:  kvf_ref_mlp(st, &c, l, xn, L, o); break;
        }
        for (size_t i = 0; i < (size_t)L * H; ++i) {
            h[i] += o[i];
        }
    }
    {
        double *nf = kvf_ref_load(st, "backbone.norm_f.weight", 1, hs);
        double *lm = kvf_ref_load(st, "lm_head.weight", 2, vh);
        double *lg = calloc((size_t)V, sizeof(double));
        kvf_ref_rmsnorm(h + (size_t)(L - 1) * H, nf, 1, H, c.norm_eps, xn);
        kvf_ref_linear(xn, lm, 1, V, H, lg);
        for (int i = 0; i < V; ++i) {
            logits[i] = (float)lg[i];
        }
        free(nf); free(lm); free(lg);
    }
    free(emb); free(h); free(xn); free(o);
    kvf_st_close(st);
}
