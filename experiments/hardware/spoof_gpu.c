/* LD_PRELOAD shim: what the CUDA driver tells its callers about the device, logged and, where
 * asked, replaced (the question: does cuBLASLt's heuristic follow these values?).
 *
 *   gcc -shared -fPIC -O2 -o spoof_gpu.so spoof_gpu.c -ldl
 *   SPOOF_LOG=log.txt SPOOF_ATTR="36=2619000,37=5120" SPOOF_NAME="NVIDIA H100 80GB HBM3" \
 *       SPOOF_MEM=85045231616 LD_PRELOAD=./spoof_gpu.so python ...
 *
 * The CUDA runtime reaches the driver through dlsym(libcuda, "cuGetProcAddress...") and then
 * cuGetProcAddress, so both are interposed: cuDeviceGetAttribute, cuDeviceGetName and
 * cuDeviceTotalMem are answered by the wrappers below. SPOOF_LOG gets each driver symbol asked
 * for and each attribute read (with the device's own value), once. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef uint64_t cuuint64_t;

static void *(*real_dlsym)(void *, const char *);
static CUresult (*real_gpa)(const char *, void **, int, cuuint64_t);
static CUresult (*real_gpa2)(const char *, void **, int, cuuint64_t, int *);
static CUresult (*real_attr)(int *, int, CUdevice);
static CUresult (*real_name)(char *, int, CUdevice);
static CUresult (*real_mem)(size_t *, CUdevice);
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char seen[65536];

static void note(const char *what) {
    const char *path = getenv("SPOOF_LOG");
    if (!path) return;
    pthread_mutex_lock(&lock);
    char key[256];
    snprintf(key, sizeof key, "|%s|", what);
    if (!strstr(seen, key) && strlen(seen) + strlen(key) < sizeof seen) {
        strcat(seen, key);
        FILE *f = fopen(path, "a");
        if (f) { fprintf(f, "%s\n", what); fclose(f); }
    }
    pthread_mutex_unlock(&lock);
}

static void *next_dlsym(void *h, const char *s) {
    if (!real_dlsym) real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!real_dlsym) real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    return real_dlsym(h, s);
}

static int spoofed_attr(int attrib, int *value) {
    const char *spec = getenv("SPOOF_ATTR");
    char key[32];
    if (!spec) return 0;
    snprintf(key, sizeof key, "%d=", attrib);
    for (const char *p = spec; (p = strstr(p, key)); p++) {
        if (p == spec || p[-1] == ',') { *value = atoi(p + strlen(key)); return 1; }
    }
    return 0;
}

static const char *caller(void *addr) {
    Dl_info info;
    return dladdr(addr, &info) && info.dli_fname ? info.dli_fname : "?";
}

static CUresult my_attr(int *pi, int attrib, CUdevice dev) {
    CUresult r = real_attr(pi, attrib, dev);
    char what[256];
    snprintf(what, sizeof what, "attribute %d = %d (from %s)", attrib, r == 0 ? *pi : -1,
             caller(__builtin_return_address(0)));
    note(what);
    if (r == 0) spoofed_attr(attrib, pi);
    return r;
}

static CUresult my_name(char *name, int len, CUdevice dev) {
    CUresult r = real_name(name, len, dev);
    note("cuDeviceGetName called");
    const char *s = getenv("SPOOF_NAME");
    if (r == 0 && s && len > 0) { strncpy(name, s, len - 1); name[len - 1] = 0; }
    return r;
}

static CUresult my_mem(size_t *bytes, CUdevice dev) {
    CUresult r = real_mem(bytes, dev);
    char what[64];
    snprintf(what, sizeof what, "total memory = %zu", r == 0 ? *bytes : 0);
    note(what);
    const char *s = getenv("SPOOF_MEM");
    if (r == 0 && s) *bytes = strtoull(s, NULL, 10);
    return r;
}

static void *wrap(const char *s, void *p, void *from) {
    char what[400];
    snprintf(what, sizeof what, "symbol %s (from %s)", s, caller(from));
    note(what);
    if (!p) return p;
    if (!strcmp(s, "cuDeviceGetAttribute")) { real_attr = p; return (void *)my_attr; }
    if (!strcmp(s, "cuDeviceGetName")) { real_name = p; return (void *)my_name; }
    if (!strncmp(s, "cuDeviceTotalMem", 16)) { real_mem = p; return (void *)my_mem; }
    return p;
}

static CUresult my_gpa(const char *s, void **pfn, int ver, cuuint64_t flags) {
    CUresult r = real_gpa(s, pfn, ver, flags);
    if (r == 0 && pfn) *pfn = wrap(s, *pfn, __builtin_return_address(0));
    return r;
}

static CUresult my_gpa2(const char *s, void **pfn, int ver, cuuint64_t flags, int *status) {
    CUresult r = real_gpa2(s, pfn, ver, flags, status);
    if (r == 0 && pfn) *pfn = wrap(s, *pfn, __builtin_return_address(0));
    return r;
}

void *dlsym(void *h, const char *s) {
    void *p = next_dlsym(h, s);
    if (!p) return p;
    if (!strcmp(s, "cuGetProcAddress_v2")) { real_gpa2 = p; return (void *)my_gpa2; }
    if (!strcmp(s, "cuGetProcAddress")) { real_gpa = p; return (void *)my_gpa; }
    if (!strncmp(s, "cuDevice", 8)) return wrap(s, p, __builtin_return_address(0));
    return p;
}
