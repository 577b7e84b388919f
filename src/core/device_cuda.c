/* The CUDA device's backend (fg__dev_backend): segments from cudaMalloc
 * under the caching allocator of device_alloc.c, a compute and a comm
 * stream (non-blocking CUDA streams), CUDA events behind fg_event, copies
 * with cudaMemcpyAsync (page-locked host memory from cudaMallocHost for
 * fg_dev_host_alloc), memset and synchronize. The runtime is linked
 * statically and loads the driver on its first call: every call is
 * checked, so on a machine without a GPU or a driver opening cuda:N fails
 * with "no CUDA device: cudaGetDeviceCount: <the runtime's reason>". */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "device_cuda.h"
#include "device_impl.h"
#include "fulgur/gpu.h"

typedef struct cuda_dev {
    int index;
    cudaStream_t streams[2]; /* fg_stream_kind: compute, comm */
} cuda_dev;

fg_status fg__cuda_check(int err, const char *what) {
    if (err == cudaSuccess) return FG_OK;
    cudaError_t e = (cudaError_t)err;
    (void)cudaGetLastError(); /* clears a non-sticky error */
    return fg_error(e == cudaErrorMemoryAllocation ? FG_ENOMEM : FG_EIO, "%s: %s (%s)", what,
                    cudaGetErrorString(e), cudaGetErrorName(e));
}

fg_status fg__cuda_device_count(int *n) {
    *n = 0;
    cudaError_t e = cudaGetDeviceCount(n);
    if (e != cudaSuccess) {
        *n = 0;
        (void)cudaGetLastError();
        return fg_error(FG_EUNSUPPORTED, "no CUDA device: cudaGetDeviceCount: %s (%s)",
                        cudaGetErrorString(e), cudaGetErrorName(e));
    }
    if (*n == 0) return fg_error(FG_EUNSUPPORTED, "no CUDA device: cudaGetDeviceCount: 0 devices");
    return FG_OK;
}

static FG_MUST_USE fg_status cuda_open(int index, size_t memory_limit, void **state) {
    (void)memory_limit; /* the allocator holds it; cudaMalloc says when the GPU is full */
    int n;
    if (fg__cuda_device_count(&n) != FG_OK)
        return fg_error(FG_EUNSUPPORTED,
                        "%s; use cpu, or guarded to test that code is device-clean",
                        fg_last_error());
    if (index >= n)
        return fg_error(FG_EINVAL,
                        "cuda:%d: this machine has %d CUDA device%s (cuda:0..cuda:%d; "
                        "CUDA_VISIBLE_DEVICES=%s)",
                        index, n, n == 1 ? "" : "s", n - 1,
                        getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
    FG_TRY(fg__cuda_check(cudaSetDevice(index), "cudaSetDevice"));
    cuda_dev *c = fg_calloc(1, sizeof *c);
    if (!c) return fg_last_status();
    c->index = index;
    for (int k = 0; k < 2; k++) {
        cudaError_t e = cudaStreamCreateWithFlags(&c->streams[k], cudaStreamNonBlocking);
        if (e != cudaSuccess) {
            if (k) cudaStreamDestroy(c->streams[0]);
            fg_free(c);
            return fg__cuda_check(e, "cudaStreamCreateWithFlags");
        }
    }
    *state = c;
    return FG_OK;
}

static void cuda_close(void *state) {
    cuda_dev *c = state;
    if (!c) return;
    if (cudaSetDevice(c->index) == cudaSuccess)
        for (int k = 0; k < 2; k++) cudaStreamDestroy(c->streams[k]);
    fg_free(c);
}

static void *cuda_segment_alloc(void *state, size_t bytes) {
    cuda_dev *c = state;
    void *p = NULL;
    if (fg__cuda_check(cudaSetDevice(c->index), "cudaSetDevice") != FG_OK) return NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        (void)cudaGetLastError();
        (void)cudaMemGetInfo(&free_b, &total_b);
        fg_error(e == cudaErrorMemoryAllocation ? FG_ENOMEM : FG_EIO,
                 "cudaMalloc of %zu bytes on cuda:%d: %s (the GPU has %zu of %zu bytes free)",
                 bytes, c->index, cudaGetErrorString(e), free_b, total_b);
        return NULL;
    }
    return p;
}

static void cuda_segment_free(void *state, void *ptr, size_t bytes) {
    cuda_dev *c = state;
    (void)bytes;
    if (cudaSetDevice(c->index) == cudaSuccess) (void)cudaFree(ptr); /* waits for the GPU */
}

static FG_MUST_USE fg_status cuda_copy(void *state, void *dst, const void *src, size_t bytes,
                                       int dir, fg_stream *s, bool async) {
    static const enum cudaMemcpyKind kinds[3] = {cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
                                                 cudaMemcpyDeviceToDevice};
    static const char *const what[3] = {"cudaMemcpyAsync host->device",
                                        "cudaMemcpyAsync device->host",
                                        "cudaMemcpyAsync device->device"};
    cuda_dev *c = state;
    int k = s && s->kind == FG_STREAM_COMM ? 1 : 0;
    FG_TRY(fg__cuda_check(cudaSetDevice(c->index), "cudaSetDevice"));
    FG_TRY(fg__cuda_check(cudaMemcpyAsync(dst, src, bytes, kinds[dir], c->streams[k]), what[dir]));
    if (!async)
        FG_TRY(fg__cuda_check(cudaStreamSynchronize(c->streams[k]), "cudaStreamSynchronize"));
    return FG_OK;
}

static FG_MUST_USE fg_status cuda_synchronize(void *state) {
    cuda_dev *c = state;
    FG_TRY(fg__cuda_check(cudaSetDevice(c->index), "cudaSetDevice"));
    for (int k = 0; k < 2; k++)
        FG_TRY(fg__cuda_check(cudaStreamSynchronize(c->streams[k]), "cudaStreamSynchronize"));
    return FG_OK;
}

static FG_MUST_USE fg_status cuda_memset(void *state, void *dst, int value, size_t bytes,
                                         int stream) {
    cuda_dev *c = state;
    FG_TRY(fg__cuda_check(cudaSetDevice(c->index), "cudaSetDevice"));
    return fg__cuda_check(cudaMemsetAsync(dst, value, bytes, c->streams[stream ? 1 : 0]),
                          "cudaMemsetAsync");
}

/* the fill kernel (src/ops/cuda/ew.cu, in the kernels archive core links) */
int fg__cu_fill(void *st, void *dst, const void *pattern, int psize, int64_t count);

static FG_MUST_USE fg_status cuda_fill(void *state, void *dst, const void *pattern, size_t psize,
                                       size_t count, int stream) {
    cuda_dev *c = state;
    FG_TRY(fg__cuda_check(cudaSetDevice(c->index), "cudaSetDevice"));
    return fg__cuda_check(
        fg__cu_fill(c->streams[stream ? 1 : 0], dst, pattern, (int)psize, (int64_t)count),
        "fill kernel launch");
}

static FG_MUST_USE fg_status cuda_stream_synchronize(void *state, int stream) {
    cuda_dev *c = state;
    FG_TRY(fg__cuda_check(cudaSetDevice(c->index), "cudaSetDevice"));
    return fg__cuda_check(cudaStreamSynchronize(c->streams[stream ? 1 : 0]),
                          "cudaStreamSynchronize");
}

static void *cuda_host_alloc(void *state, size_t bytes) {
    cuda_dev *c = state;
    void *p = NULL;
    if (fg__cuda_check(cudaSetDevice(c->index), "cudaSetDevice") != FG_OK) return NULL;
    cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        if (fg__cuda_check(e, "cudaMallocHost") != FG_OK) /* always: e is not cudaSuccess */
            fg_error_wrap(FG_ENOMEM, "%zu bytes of page-locked host memory", bytes);
        return NULL;
    }
    return p;
}

static void cuda_host_free(void *state, void *ptr) {
    (void)state;
    (void)cudaFreeHost(ptr);
}

static void *cuda_event_new(void *state) {
    cuda_dev *c = state;
    cudaEvent_t ev = NULL;
    if (fg__cuda_check(cudaSetDevice(c->index), "cudaSetDevice") != FG_OK) return NULL;
    if (fg__cuda_check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming),
                       "cudaEventCreateWithFlags") != FG_OK)
        return NULL;
    return ev;
}

static void cuda_event_free(void *state, void *ev) {
    (void)state;
    (void)cudaEventDestroy((cudaEvent_t)ev);
}

static FG_MUST_USE fg_status cuda_event_record(void *state, void *ev, int stream) {
    cuda_dev *c = state;
    FG_TRY(fg__cuda_check(cudaSetDevice(c->index), "cudaSetDevice"));
    return fg__cuda_check(cudaEventRecord((cudaEvent_t)ev, c->streams[stream ? 1 : 0]),
                          "cudaEventRecord");
}

static FG_MUST_USE fg_status cuda_event_wait(void *state, int stream, void *ev) {
    cuda_dev *c = state;
    FG_TRY(fg__cuda_check(cudaSetDevice(c->index), "cudaSetDevice"));
    return fg__cuda_check(cudaStreamWaitEvent(c->streams[stream ? 1 : 0], (cudaEvent_t)ev, 0),
                          "cudaStreamWaitEvent");
}

static bool cuda_event_query(void *state, void *ev) {
    (void)state;
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    if (e != cudaSuccess && e != cudaErrorNotReady) (void)cudaGetLastError();
    return e == cudaSuccess;
}

static FG_MUST_USE fg_status cuda_event_synchronize(void *state, void *ev) {
    (void)state;
    return fg__cuda_check(cudaEventSynchronize((cudaEvent_t)ev), "cudaEventSynchronize");
}

/* The backend's device count, without initialising CUDA in this process (a
 * parent that initialises the CUDA runtime before its ranks fork leaves
 * them unable to use it): no GPU for NVML is 0 at once (no driver); else a
 * forked child asks cudaGetDeviceCount (which applies CUDA_VISIBLE_DEVICES
 * and sees a driver too old for the runtime) and writes the answer back.
 * Kept per value of CUDA_VISIBLE_DEVICES. */
static int count_gpus(char *why, size_t n);

/* the thread's error stays as it was (a count is a question, not a failure) */
static int cuda_device_count(char *why, size_t n) {
    fg_error_kept k;
    fg_error_keep(&k);
    int c = count_gpus(why, n);
    (void)fg_error_restore(&k);
    return c;
}

static int count_gpus(char *why, size_t n) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static char cached_env[256] = "\1", cached_why[512];
    static int cached = -1;
    const char *env = getenv("CUDA_VISIBLE_DEVICES");
    char key[256];
    snprintf(key, sizeof key, "%s%s", env ? "=" : "", env ? env : "");
    pthread_mutex_lock(&mu);
    if (cached >= 0 && !strcmp(key, cached_env)) {
        int c = cached;
        if (why && n) snprintf(why, n, "%s", cached_why);
        pthread_mutex_unlock(&mu);
        return c;
    }
    fg_gpu_info g[64];
    int listed = 0, count = 0;
    char msg[512] = ""; /* the reason: text up to 200 bytes and the variable */
    if (fg_gpu_list(g, 64, &listed) != FG_OK) {
        snprintf(msg, sizeof msg, "%s", fg_last_error());
    } else {
        struct {
            int count, err;
            char text[200];
        } r = {0, -1, ""};
        int fd[2];
        if (pipe(fd) == 0) {
            pid_t pid = fork();
            if (pid == 0) {
                close(fd[0]);
                cudaError_t e = cudaGetDeviceCount(&r.count);
                r.err = (int)e;
                if (e != cudaSuccess) {
                    r.count = 0;
                    snprintf(r.text, sizeof r.text, "%s (%s)", cudaGetErrorString(e),
                             cudaGetErrorName(e));
                }
                ssize_t w = write(fd[1], &r, sizeof r);
                _exit(w == (ssize_t)sizeof r ? 0 : 1);
            }
            close(fd[1]);
            ssize_t got = 0;
            if (pid > 0) {
                while ((got = read(fd[0], &r, sizeof r)) < 0 && errno == EINTR) {
                }
                while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
                }
            }
            close(fd[0]);
            if (pid < 0 || got != (ssize_t)sizeof r)
                snprintf(msg, sizeof msg,
                         "no CUDA device: the child asking cudaGetDeviceCount "
                         "gave no answer");
            else if (r.err != 0)
                snprintf(msg, sizeof msg, "no CUDA device: cudaGetDeviceCount: %s%s%s", r.text,
                         env ? " with CUDA_VISIBLE_DEVICES=" : "", env ? env : "");
            else if (!(count = r.count))
                snprintf(msg, sizeof msg, "no CUDA device: cudaGetDeviceCount: 0 devices%s%s",
                         env ? " with CUDA_VISIBLE_DEVICES=" : "", env ? env : "");
        } else {
            snprintf(msg, sizeof msg, "pipe: %s", strerror(errno));
        }
    }
    cached = count;
    snprintf(cached_env, sizeof cached_env, "%s", key);
    snprintf(cached_why, sizeof cached_why, "%s", msg);
    pthread_mutex_unlock(&mu);
    if (why && n) snprintf(why, n, "%s", msg);
    return count;
}

const fg__dev_backend fg__dev_cuda_backend = {
    .kind = FG_CUDA,
    .host_accessible = false,
    .caching = true,
    .default_limit = 0, /* the GPU's own memory: cudaMalloc says when it is full */
    .open = cuda_open,
    .close = cuda_close,
    .segment_alloc = cuda_segment_alloc,
    .segment_free = cuda_segment_free,
    .host_view = NULL,
    .copy = cuda_copy,
    .synchronize = cuda_synchronize,
    .device_count = cuda_device_count,
    .memset = cuda_memset,
    .fill = cuda_fill,
    .stream_synchronize = cuda_stream_synchronize,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .event_new = cuda_event_new,
    .event_free = cuda_event_free,
    .event_record = cuda_event_record,
    .event_wait = cuda_event_wait,
    .event_query = cuda_event_query,
    .event_synchronize = cuda_event_synchronize,
};

void *fg__cuda_stream(fg_dev *d, int kind) {
    if (!d || d->be != &fg__dev_cuda_backend) {
        fg_error(FG_EINVAL, "a CUDA kernel on a tensor that is not on a cuda device (%s)",
                 d ? d->name : "host memory");
        return NULL;
    }
    if (fg__dev_check_process(d) != FG_OK) return NULL;
    cuda_dev *c = d->state;
    if (fg__cuda_check(cudaSetDevice(c->index), "cudaSetDevice") != FG_OK) return NULL;
    return c->streams[kind ? 1 : 0];
}

int fg__cuda_index(const fg_dev *d) { return ((const cuda_dev *)d->state)->index; }
