/* DataLoader: deterministic (seeded) order, batching, normalisation, sharding,
 * and worker threads filling a bounded ring of batches in order.
 *
 * Ring protocol: batch k of the epoch is built in slot k % nslots. A worker
 * may start batch k only when k < released + nslots, where `released` counts
 * the batches the consumer is done with (it releases the batch it holds when
 * it asks for the next one). The consumer waits until slot next % nslots holds
 * batch `next`, so batches come out in order whatever the thread timing; the
 * content of batch k depends only on the epoch order, never on which worker
 * built it. */
#include "runtime/runtime_internal.h"
#include "ember/data.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MSG_LEN 1024

enum { SLOT_EMPTY = 0, SLOT_FILLING = 1, SLOT_READY = 2 };

typedef struct slot {
    float *x;
    int64_t *y;
    int64_t *idx;
    float *tmp; /* image-transform scratch (one image) or NULL */
    int64_t batch;
    int64_t size;
    int state;
    em_status st;
    char msg[MSG_LEN];
} slot;

struct em_loader {
    em_dataset *ds;
    em_loader_options opt;
    int64_t nf;
    float *fmean, *fstd; /* per-feature (owned) or NULL */
    bool normalize;
    em_image_transform tf; /* resolved sizes; mean/std owned copies */
    bool transform;

    int64_t epoch;
    bool started;
    int64_t *order; /* this shard's dataset indices for the epoch */
    int64_t m, nb;  /* samples, batches */

    int nslots;
    slot *slots;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_ready;
    int64_t next_issue, next_out, released;
    bool holding, stop, failed;
    em_status fail_st;
    char fail_msg[MSG_LEN];
    pthread_t *threads;
    int nthreads;

    em_batch cur;
};

uint64_t em_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* Uniform integer in [0, bound] (bound < 2^63) by rejection: unbiased. */
static uint64_t uniform_upto(uint64_t *state, uint64_t bound)
{
    uint64_t range = bound + 1;
    uint64_t limit = UINT64_MAX - (UINT64_MAX % range); /* accept r < limit */
    for (;;) {
        uint64_t r = em_splitmix64(state);
        if (r < limit) return r % range;
    }
}

em_image_transform em_image_transform_eval(em_image_transform t)
{
    t.crop_padding = 0;
    t.hflip_p = 0;
    return t;
}

uint64_t em_image_transform_state(uint64_t seed, int64_t epoch, int64_t position)
{
    /* three splitmix64 finalisations chained: distinct (seed, epoch, position)
     * triples give unrelated streams; the constant keeps them apart from the
     * shuffle's stream of the same seed */
    uint64_t s = seed ^ UINT64_C(0x6A09E667F3BCC909);
    uint64_t h = em_splitmix64(&s);
    s = h ^ (uint64_t)epoch;
    h = em_splitmix64(&s);
    s = h ^ (uint64_t)position;
    return em_splitmix64(&s);
}

em_status em_image_transform_apply(const em_image_transform *t, float *x, float *tmp, uint64_t *state)
{
    if (!t || !x || (!tmp && t->crop_padding > 0) || !state)
        return em__set_error(EM_ERR_INVALID, "em_image_transform_apply: NULL argument");
    const int64_t C = t->channels, H = t->height, W = t->width, P = t->crop_padding;
    if (C < 1 || H < 1 || W < 1 || P < 0 || !(t->hflip_p >= 0 && t->hflip_p <= 1))
        return em__set_error(EM_ERR_INVALID, "em_image_transform_apply: bad transform (image %lldx%lldx%lld, padding %lld, hflip_p %g)",
                             (long long)C, (long long)H, (long long)W, (long long)P, t->hflip_p);
    if (P > 0) {
        const int64_t dy = (int64_t)uniform_upto(state, (uint64_t)(2 * P)) - P;
        const int64_t dx = (int64_t)uniform_upto(state, (uint64_t)(2 * P)) - P;
        memcpy(tmp, x, sizeof(float) * (size_t)(C * H * W));
        for (int64_t c = 0; c < C; c++)
            for (int64_t y = 0; y < H; y++) {
                float *o = x + (c * H + y) * W;
                const int64_t sy = y + dy;
                if (sy < 0 || sy >= H) {
                    memset(o, 0, sizeof(float) * (size_t)W);
                    continue;
                }
                const float *in = tmp + (c * H + sy) * W;
                for (int64_t xx = 0; xx < W; xx++) {
                    const int64_t sx = xx + dx;
                    o[xx] = sx >= 0 && sx < W ? in[sx] : 0.0f;
                }
            }
    }
    if (t->hflip_p > 0) {
        const double u = (double)(em_splitmix64(state) >> 11) * 0x1.0p-53;
        if (u < t->hflip_p)
            for (int64_t r = 0; r < C * H; r++) {
                float *row = x + r * W;
                for (int64_t a = 0, b = W - 1; a < b; a++, b--) {
                    float v = row[a];
                    row[a] = row[b];
                    row[b] = v;
                }
            }
    }
    if (t->mean)
        for (int64_t c = 0; c < C; c++) {
            const float m = t->mean[c], sd = t->std[c];
            float *p = x + c * H * W;
            for (int64_t i = 0; i < H * W; i++) p[i] = (p[i] - m) / sd;
        }
    return EM_OK;
}

em_loader_options em_loader_options_default(void)
{
    em_loader_options o;
    memset(&o, 0, sizeof o);
    o.batch_size = 32;
    o.shuffle = false;
    o.seed = 0;
    o.drop_last = false;
    o.num_workers = 0;
    o.prefetch = 0; /* 0 = 2 * num_workers */
    o.mean = 0.0f;
    o.std = 1.0f;
    o.rank = 0;
    o.world_size = 1;
    o.shard_even = false;
    return o;
}

static void stop_workers(em_loader *l)
{
    if (!l->nthreads) return;
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_broadcast(&l->cv_work);
    pthread_cond_broadcast(&l->cv_ready);
    pthread_mutex_unlock(&l->mu);
    for (int i = 0; i < l->nthreads; i++) pthread_join(l->threads[i], NULL);
    l->nthreads = 0;
}

void em_loader_free(em_loader *l)
{
    if (!l) return;
    stop_workers(l);
    if (l->slots)
        for (int i = 0; i < l->nslots; i++) {
            free(l->slots[i].x);
            free(l->slots[i].y);
            free(l->slots[i].idx);
            free(l->slots[i].tmp);
        }
    free(l->slots);
    free(l->threads);
    free(l->order);
    free(l->fmean);
    free(l->fstd);
    free((float *)l->tf.mean);
    free((float *)l->tf.std);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv_work);
    pthread_cond_destroy(&l->cv_ready);
    free(l);
}

em_loader *em_loader_new(em_dataset *ds, const em_loader_options *opt)
{
    if (!ds || !ds->vt) return em__fail(EM_ERR_INVALID, "em_loader_new: dataset is NULL");
    em_loader_options o = opt ? *opt : em_loader_options_default();
    if (o.batch_size < 1)
        return em__fail(EM_ERR_INVALID, "em_loader_new: batch_size %lld < 1", (long long)o.batch_size);
    if (o.batch_size > (INT64_C(1) << 40) / ds->num_features)
        return em__fail(EM_ERR_INVALID, "em_loader_new: batch_size %lld x %lld features is too large",
                        (long long)o.batch_size, (long long)ds->num_features);
    if (o.num_workers < 0 || o.num_workers > 256)
        return em__fail(EM_ERR_INVALID, "em_loader_new: num_workers %d outside [0, 256]", o.num_workers);
    if (o.prefetch < 0 || o.prefetch > 1024)
        return em__fail(EM_ERR_INVALID, "em_loader_new: prefetch %d outside [0, 1024]", o.prefetch);
    if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size)
        return em__fail(EM_ERR_INVALID, "em_loader_new: rank %d outside [0, world_size %d)", o.rank, o.world_size);
    if ((o.feature_mean == NULL) != (o.feature_std == NULL))
        return em__fail(EM_ERR_INVALID, "em_loader_new: feature_mean and feature_std must both be set or both NULL");
    if (!o.feature_mean && !(o.std != 0.0f && o.std == o.std))
        return em__fail(EM_ERR_INVALID, "em_loader_new: normalisation std must be non-zero (got %g)", (double)o.std);
    em_image_transform tf = o.transform;
    const bool transform = tf.crop_padding != 0 || tf.hflip_p != 0 || tf.mean || tf.std;
    if (transform) {
        if (tf.channels == 0 && tf.height == 0 && tf.width == 0) {
            const int nd = ds->feature_ndim;
            if (nd != 2 && nd != 3)
                return em__fail(EM_ERR_INVALID, "em_loader_new: image transform: the dataset's samples have rank %d, not an image "
                                "[C, H, W] (give transform.channels/height/width)", nd);
            tf.channels = nd == 3 ? ds->feature_shape[0] : 1;
            tf.height = ds->feature_shape[nd - 2];
            tf.width = ds->feature_shape[nd - 1];
        }
        if (tf.channels < 1 || tf.height < 1 || tf.width < 1 || tf.channels * tf.height * tf.width != ds->num_features)
            return em__fail(EM_ERR_INVALID, "em_loader_new: image transform of %lldx%lldx%lld does not match the %lld features of a sample",
                            (long long)tf.channels, (long long)tf.height, (long long)tf.width, (long long)ds->num_features);
        if (tf.crop_padding < 0 || tf.crop_padding > (INT64_C(1) << 30))
            return em__fail(EM_ERR_INVALID, "em_loader_new: image transform: crop_padding %lld outside [0, 2^30]",
                            (long long)tf.crop_padding);
        if (!(tf.hflip_p >= 0 && tf.hflip_p <= 1))
            return em__fail(EM_ERR_INVALID, "em_loader_new: image transform: hflip_p %g outside [0, 1]", tf.hflip_p);
        if ((tf.mean == NULL) != (tf.std == NULL))
            return em__fail(EM_ERR_INVALID, "em_loader_new: image transform: mean and std must both be set or both NULL");
        for (int64_t c = 0; tf.std && c < tf.channels; c++)
            if (!(tf.std[c] != 0.0f && tf.std[c] == tf.std[c]))
                return em__fail(EM_ERR_INVALID, "em_loader_new: image transform: std[%lld] must be non-zero (got %g)", (long long)c,
                                (double)tf.std[c]);
    }

    em_loader *l = calloc(1, sizeof *l);
    if (!l) return em__fail(EM_ERR_NOMEM, "em_loader_new: out of memory");
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv_work, NULL);
    pthread_cond_init(&l->cv_ready, NULL);
    l->ds = ds;
    l->nf = ds->num_features;
    o.transform = (em_image_transform){0}; /* do not keep the caller's pointers */
    if (transform) {
        l->transform = true;
        l->tf = tf;
        l->tf.mean = l->tf.std = NULL;
        if (tf.mean) {
            size_t cb = (size_t)tf.channels * sizeof(float);
            float *m = malloc(cb), *sd = malloc(cb);
            l->tf.mean = m;
            l->tf.std = sd;
            if (!m || !sd) goto nomem;
            memcpy(m, tf.mean, cb);
            memcpy(sd, tf.std, cb);
        }
    }
    size_t fbytes = (size_t)l->nf * sizeof(float);
    if (o.feature_mean) {
        l->fmean = malloc(fbytes);
        l->fstd = malloc(fbytes);
        if (!l->fmean || !l->fstd) goto nomem;
        memcpy(l->fmean, o.feature_mean, fbytes);
        memcpy(l->fstd, o.feature_std, fbytes);
        for (int64_t i = 0; i < l->nf; i++)
            if (!(l->fstd[i] != 0.0f && l->fstd[i] == l->fstd[i])) {
                em_loader_free(l);
                return em__fail(EM_ERR_INVALID, "em_loader_new: feature_std[%lld] must be non-zero (got %g)",
                                (long long)i, (double)o.feature_std[i]);
            }
        l->normalize = true;
        o.feature_mean = o.feature_std = NULL; /* do not keep the caller's pointers */
    } else {
        l->normalize = !(o.mean == 0.0f && o.std == 1.0f);
    }
    if (o.num_workers > 0 && o.prefetch == 0) o.prefetch = 2 * o.num_workers;
    l->opt = o;
    l->nslots = o.num_workers > 0 ? o.prefetch + 1 : 1;
    l->slots = calloc((size_t)l->nslots, sizeof *l->slots);
    l->threads = calloc((size_t)(o.num_workers ? o.num_workers : 1), sizeof *l->threads);
    if (!l->slots || !l->threads) goto nomem;
    for (int i = 0; i < l->nslots; i++) {
        slot *s = &l->slots[i];
        s->x = malloc((size_t)(o.batch_size * l->nf) * sizeof(float));
        s->y = malloc((size_t)o.batch_size * sizeof(int64_t));
        s->idx = malloc((size_t)o.batch_size * sizeof(int64_t));
        if (!s->x || !s->y || !s->idx) goto nomem;
        if (l->transform && l->tf.crop_padding > 0 && !(s->tmp = malloc((size_t)l->nf * sizeof(float)))) goto nomem;
    }
    return l;
nomem:
    em_loader_free(l);
    return em__fail(EM_ERR_NOMEM, "em_loader_new: out of memory (batch_size %lld, %lld features, %d slots)",
                    (long long)o.batch_size, (long long)ds->num_features, o.num_workers ? o.prefetch + 1 : 1);
}

/* Builds batch k into s. Thread-safe (reads only loader fields fixed for the
 * epoch). On failure s->st/s->msg describe it. */
static void fill_batch(em_loader *l, int64_t k, slot *s)
{
    int64_t B = l->opt.batch_size, nf = l->nf;
    int64_t start = k * B, size = l->m - start < B ? l->m - start : B;
    s->st = EM_OK;
    s->msg[0] = 0;
    s->size = size;
    s->batch = k;
    for (int64_t b = 0; b < size; b++) {
        int64_t idx = l->order[start + b];
        float *x = s->x + b * nf;
        s->idx[b] = idx;
        em_clear_error();
        em_status st = l->ds->vt->get(l->ds, idx, x, &s->y[b]);
        if (st != EM_OK) {
            const char *why = em_last_error();
            s->st = st < 0 ? st : EM_ERR_RUNTIME;
            snprintf(s->msg, MSG_LEN, "em_loader_next: sample %lld (batch %lld of epoch %lld): %s", (long long)idx,
                     (long long)k, (long long)l->epoch, why && why[0] ? why : em_status_str(s->st));
            return;
        }
        if (l->transform) {
            /* position in the epoch's unsharded order: shard r holds positions r, r + W, ... */
            int64_t pos = (int64_t)l->opt.rank + (start + b) * (int64_t)l->opt.world_size;
            uint64_t state = em_image_transform_state(l->opt.seed, l->epoch, pos);
            em_image_transform_apply(&l->tf, x, s->tmp, &state); /* cannot fail: checked by em_loader_new */
        }
        if (l->normalize) {
            if (l->fmean) {
                for (int64_t j = 0; j < nf; j++) x[j] = (x[j] - l->fmean[j]) / l->fstd[j];
            } else {
                float mean = l->opt.mean, std = l->opt.std;
                for (int64_t j = 0; j < nf; j++) x[j] = (x[j] - mean) / std;
            }
        }
    }
}

static void *worker_main(void *arg)
{
    em_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    while (!l->stop && l->next_issue < l->nb) {
        if (l->next_issue >= l->released + l->nslots) {
            pthread_cond_wait(&l->cv_work, &l->mu);
            continue;
        }
        int64_t k = l->next_issue++;
        slot *s = &l->slots[k % l->nslots];
        s->state = SLOT_FILLING;
        pthread_mutex_unlock(&l->mu);
        fill_batch(l, k, s);
        pthread_mutex_lock(&l->mu);
        s->state = SLOT_READY;
        pthread_cond_broadcast(&l->cv_ready);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

em_status em_loader_start_epoch(em_loader *l, int64_t epoch)
{
    if (!l) return em__set_error(EM_ERR_INVALID, "em_loader_start_epoch: loader is NULL");
    if (epoch < 0) return em__set_error(EM_ERR_INVALID, "em_loader_start_epoch: negative epoch %lld", (long long)epoch);
    stop_workers(l);
    l->started = false;
    int64_t n = l->ds->vt->length(l->ds);
    if (n < 0) return em__set_error(EM_ERR_RUNTIME, "em_loader_start_epoch: dataset length %lld", (long long)n);
    int64_t *perm = malloc((size_t)(n ? n : 1) * sizeof *perm);
    if (!perm) return em__set_error(EM_ERR_NOMEM, "em_loader_start_epoch: out of memory for %lld indices", (long long)n);
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    if (l->opt.shuffle && n > 1) {
        uint64_t state = l->opt.seed ^ ((uint64_t)epoch * UINT64_C(0xD1B54A32D192ED03));
        for (int64_t i = n - 1; i > 0; i--) {
            int64_t j = (int64_t)uniform_upto(&state, (uint64_t)i);
            int64_t t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
    }
    int64_t W = l->opt.world_size, r = l->opt.rank;
    int64_t limit = l->opt.shard_even ? (n / W) * W : n;
    int64_t m = 0;
    for (int64_t p = r; p < limit; p += W) perm[m++] = perm[p]; /* in place: m <= p */
    free(l->order);
    l->order = perm;
    l->m = m;
    l->nb = l->opt.drop_last ? m / l->opt.batch_size : (m + l->opt.batch_size - 1) / l->opt.batch_size;
    l->epoch = epoch;
    l->next_issue = l->next_out = l->released = 0;
    l->holding = l->stop = l->failed = false;
    l->fail_st = EM_OK;
    l->fail_msg[0] = 0;
    for (int i = 0; i < l->nslots; i++) l->slots[i].state = SLOT_EMPTY;
    l->started = true;
    int want = l->opt.num_workers;
    if (want > l->nb) want = (int)l->nb;
    for (int i = 0; i < want; i++) {
        if (pthread_create(&l->threads[i], NULL, worker_main, l) != 0) break;
        l->nthreads++;
    }
    /* when no thread could be started, em_loader_next loads in the caller */
    return EM_OK;
}

static const em_batch *publish(em_loader *l, const slot *s)
{
    em_batch *b = &l->cur;
    b->size = s->size;
    b->num_features = l->nf;
    b->x = s->x;
    b->y = s->y;
    b->indices = s->idx;
    b->index = s->batch;
    b->epoch = l->epoch;
    b->feature_ndim = l->ds->feature_ndim;
    memcpy(b->feature_shape, l->ds->feature_shape, sizeof b->feature_shape);
    return b;
}

const em_batch *em_loader_next(em_loader *l)
{
    if (!l) return em__fail(EM_ERR_INVALID, "em_loader_next: loader is NULL");
    if (!l->started && em_loader_start_epoch(l, 0) != EM_OK) return NULL;
    if (l->nthreads == 0) {
        /* synchronous: build the batch here, in slot 0 */
        if (l->failed) return em__fail(l->fail_st, "%s", l->fail_msg);
        if (l->next_out >= l->nb) {
            em_clear_error();
            return NULL;
        }
        slot *s = &l->slots[0];
        fill_batch(l, l->next_out, s);
        if (s->st != EM_OK) {
            l->failed = true;
            l->fail_st = s->st;
            memcpy(l->fail_msg, s->msg, MSG_LEN);
            return em__fail(l->fail_st, "%s", l->fail_msg);
        }
        l->next_out++;
        em_clear_error();
        return publish(l, s);
    }
    pthread_mutex_lock(&l->mu);
    if (l->holding) {
        l->released++;
        l->holding = false;
        pthread_cond_broadcast(&l->cv_work);
    }
    if (l->failed) {
        pthread_mutex_unlock(&l->mu);
        return em__fail(l->fail_st, "%s", l->fail_msg);
    }
    if (l->next_out >= l->nb) {
        pthread_mutex_unlock(&l->mu);
        em_clear_error();
        return NULL;
    }
    slot *s = &l->slots[l->next_out % l->nslots];
    while (!(s->state == SLOT_READY && s->batch == l->next_out)) pthread_cond_wait(&l->cv_ready, &l->mu);
    if (s->st != EM_OK) {
        l->failed = true;
        l->fail_st = s->st;
        memcpy(l->fail_msg, s->msg, MSG_LEN);
        l->stop = true;
        pthread_cond_broadcast(&l->cv_work);
        pthread_mutex_unlock(&l->mu);
        return em__fail(l->fail_st, "%s", l->fail_msg);
    }
    l->holding = true;
    l->next_out++;
    const em_batch *b = publish(l, s);
    pthread_mutex_unlock(&l->mu);
    em_clear_error();
    return b;
}

int64_t em_loader_num_samples(const em_loader *l)
{
    if (!l) {
        em__set_error(EM_ERR_INVALID, "em_loader_num_samples: loader is NULL");
        return -1;
    }
    int64_t n = l->ds->vt->length(l->ds), W = l->opt.world_size, r = l->opt.rank;
    int64_t limit = l->opt.shard_even ? (n / W) * W : n;
    return limit > r ? (limit - r + W - 1) / W : 0;
}

int64_t em_loader_num_batches(const em_loader *l)
{
    int64_t m = em_loader_num_samples(l);
    if (m < 0) return -1;
    int64_t B = l->opt.batch_size;
    return l->opt.drop_last ? m / B : (m + B - 1) / B;
}

em_status em_batch_to_tensors(const em_batch *batch, em_tensor **x, em_tensor **y)
{
    if (x) *x = NULL;
    if (y) *y = NULL;
    if (!batch) return em__set_error(EM_ERR_INVALID, "em_batch_to_tensors: batch is NULL");
    em_tensor *tx = NULL, *ty = NULL;
    if (x) {
        int64_t shape[EM_MAX_DIMS];
        shape[0] = batch->size;
        for (int i = 0; i < batch->feature_ndim; i++) shape[i + 1] = batch->feature_shape[i];
        tx = em_from_host(batch->x, shape, batch->feature_ndim + 1, EM_F32);
        if (!tx) return em_last_status() < 0 ? em_last_status() : EM_ERR_RUNTIME;
    }
    if (y) {
        int64_t shape[1] = {batch->size};
        ty = em_from_host(batch->y, shape, 1, EM_I64);
        if (!ty) {
            em_status st = em_last_status() < 0 ? em_last_status() : EM_ERR_RUNTIME;
            em_tensor_release(tx);
            return st;
        }
    }
    if (x) *x = tx;
    if (y) *y = ty;
    return EM_OK;
}
