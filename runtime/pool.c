/* Storage pool: one StarPU byte-vector handle per storage, recycled by size
 * and device.
 *
 * Registering a handle costs 5-17 us, so released storages go back to a pool
 * keyed by byte size and by the device that was current when the storage was
 * made, instead of being unregistered. Reusing a handle whose previous
 * contents are still read by pending tasks is safe: StarPU's sequential
 * consistency orders the new writer after those readers. That ordering is
 * also why the device is part of the key: with replicas on several devices
 * (em_replicas) a handle released by replica 0 and taken by replica 1 would
 * make replica 1's next write wait for replica 0's pending readers and move
 * the buffer's allocation to the other GPU; measured on 2 x H200, it put one
 * replica's step 1.8 ms behind the other's.
 *
 * Up to 256 storages of one size are kept while they are small (1 MiB or
 * less): a fused element-wise chain (fusion/fusion.c) holds up to 32 outputs
 * until it is submitted, so with a few kept results the working set of one
 * size passes 32, and a cap of 32 registered and unregistered a handle for
 * nearly every op. Larger sizes keep the cap of 32, so the memory a pool can
 * keep alive for them is unchanged. */
#include "runtime/runtime_internal.h"

#include <pthread.h>
#include <starpu.h>
#include <stdlib.h>

#define POOL_BUCKETS 256
#define POOL_PER_SIZE 256     /* storages of one size kept, up to POOL_SMALL_BYTES each */
#define POOL_PER_SIZE_BIG 32  /* larger ones */
#define POOL_SMALL_BYTES ((size_t)1 << 20)
#define POOL_MAX_BYTES ((size_t)2 << 30)

typedef struct bucket {
    size_t nbytes;
    int cls; /* current_class() of the storages in it */
    int n;
    starpu_data_handle_t h[POOL_PER_SIZE];
    struct bucket *next;
} bucket;

static bucket *g_buckets[POOL_BUCKETS];
static size_t g_pooled_bytes;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

int64_t em__live_tensors, em__live_storages, em__handles, em__pooled, em__tasks;

static bucket **find_bucket(size_t nbytes, int cls, bool create)
{
    size_t i = ((nbytes * 2654435761u) ^ ((size_t)cls * 40503u)) % POOL_BUCKETS;
    bucket **b = &g_buckets[i];
    while (*b && ((*b)->nbytes != nbytes || (*b)->cls != cls)) b = &(*b)->next;
    if (!*b && create) {
        *b = calloc(1, sizeof **b);
        if (*b) {
            (*b)->nbytes = nbytes;
            (*b)->cls = cls;
        }
    }
    return b;
}

/* Pool class of the calling thread's current device: 0 for the CPU and
 * auto, one per accelerator otherwise. */
static int current_class(void)
{
    em_device d = em_get_device();
    return d.kind == EM_DEVICE_CPU || d.kind == EM_DEVICE_AUTO ? 0 : (int)d.kind * 256 + d.index + 1;
}

em_storage *em__storage_acquire(size_t nbytes)
{
    size_t reg = nbytes ? nbytes : 1;
    em_storage *s = EM_FAULT(EM_FAULT_ALLOC) ? NULL : malloc(sizeof *s);
    if (!s) return NULL;
    s->nbytes = nbytes;
    s->refcount = 1;
    s->handle = NULL;
    s->pool_class = current_class();
    pthread_mutex_lock(&g_lock);
    bucket **b = find_bucket(reg, s->pool_class, false);
    if (*b && (*b)->n > 0) {
        s->handle = (*b)->h[--(*b)->n];
        g_pooled_bytes -= reg;
        __atomic_sub_fetch(&em__pooled, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&g_lock);
    if (!s->handle) {
        starpu_data_handle_t h;
        starpu_vector_data_register(&h, -1, 0, (uint32_t)0 + reg, 1);
        s->handle = h;
        __atomic_add_fetch(&em__handles, 1, __ATOMIC_RELAXED);
    }
    __atomic_add_fetch(&em__live_storages, 1, __ATOMIC_RELAXED);
    return s;
}

void em__storage_release(em_storage *s)
{
    if (!s) return;
    if (__atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
    size_t reg = s->nbytes ? s->nbytes : 1;
    bool pooled = false;
    if (em_is_initialized()) {
        pthread_mutex_lock(&g_lock);
        if (g_pooled_bytes + reg <= POOL_MAX_BYTES) {
            bucket **b = find_bucket(reg, s->pool_class, true);
            if (*b && (*b)->n < (reg <= POOL_SMALL_BYTES ? POOL_PER_SIZE : POOL_PER_SIZE_BIG)) {
                (*b)->h[(*b)->n++] = s->handle;
                g_pooled_bytes += reg;
                pooled = true;
                __atomic_add_fetch(&em__pooled, 1, __ATOMIC_RELAXED);
            }
        }
        pthread_mutex_unlock(&g_lock);
        if (!pooled) {
            starpu_data_unregister_submit(s->handle);
            __atomic_sub_fetch(&em__handles, 1, __ATOMIC_RELAXED);
        }
    }
    __atomic_sub_fetch(&em__live_storages, 1, __ATOMIC_RELAXED);
    free(s);
}

void em__pool_drain(void)
{
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < POOL_BUCKETS; i++) {
        bucket *b = g_buckets[i];
        while (b) {
            for (int k = 0; k < b->n; k++) {
                starpu_data_unregister(b->h[k]);
                __atomic_sub_fetch(&em__handles, 1, __ATOMIC_RELAXED);
                __atomic_sub_fetch(&em__pooled, 1, __ATOMIC_RELAXED);
            }
            bucket *next = b->next;
            free(b);
            b = next;
        }
        g_buckets[i] = NULL;
    }
    g_pooled_bytes = 0;
    pthread_mutex_unlock(&g_lock);
}
