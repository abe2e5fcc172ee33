/*
 * gpusim: a simulated libnvidia-ml.so.1.
 *
 * The unmodified pynvml bindings (and anything else that dlopen()s
 * "libnvidia-ml.so.1") load this library through LD_LIBRARY_PATH.  It serves
 * the state described by two text files in the scenario directory DIR (see
 * tests/gpusim/README.md, the contract this file implements):
 *
 *   DIR/scenario  the simulated host (GPUs, driver, faults), written by
 *                 gpusimkit/scenario.py;
 *   DIR/procs     the GPU contexts of real processes, written by the driver
 *                 daemon (gpusimkit/driver.py).
 *
 * DIR is $GPUSIM_DIR, else the parent of the directory holding this library.
 *
 * Each file is re-read only when its (st_mtim, st_ino, st_size) changed since
 * the last read in this process, so a cheap query costs one stat(2) plus a
 * few hundred nanoseconds of C.  A process line is judged at every query
 * (is the process alive? which pid does the caller see?), by reading
 * /proc/<pid>/stat of the processes on the queried GPU only.
 *
 * Everything that is not part of the API is static: `nm -g --defined-only
 * build/nvml.o` lists exactly the exported NVML symbols (gpusimkit/build.py
 * relies on that to link variants with hidden symbols).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define NVMLAPI __attribute__((visibility("default")))

/* ---- NVML types and constants (nvml.h, NVML_API_VERSION 13) ------------- */

typedef int nvmlReturn_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NO_PERMISSION 4
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_CORRUPTED_INFOROM 14
#define NVML_ERROR_GPU_IS_LOST 15
#define NVML_ERROR_LIB_RM_VERSION_MISMATCH 18
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_ERROR_UNKNOWN 999

#define NVML_VALUE_NOT_AVAILABLE_ULL (~0ULL)
#define NVML_INVALID_INSTANCE_ID 0xFFFFFFFFu /* gpuInstanceId/computeInstanceId when MIG is off */
#define NVML_BRAND_NVIDIA 14
#define NVML_TEMPERATURE_GPU 0

/* nvmlProcessMode_t (nvmlDeviceGetRunningProcessDetailList's `mode`) */
#define NVML_PROCESS_MODE_COMPUTE 0
#define NVML_PROCESS_MODE_GRAPHICS 1
#define NVML_PROCESS_MODE_MPS 2

/* NVML_STRUCT_VERSION(type, ver) = sizeof(type) | ver << 24 */
#define NVML_MEMORY_V2_VERSION ((unsigned)(sizeof(nvmlMemory_v2_t) | (2u << 24)))     /* 0x02000028 */
#define NVML_TEMPERATURE_V1_VERSION ((unsigned)(sizeof(nvmlTemperature_t) | (1u << 24))) /* 0x0100000C */
/* nvmlProcessDetailList_v1 = 0x01000018 */
#define NVML_PROCESS_DETAIL_LIST_V1_VERSION ((unsigned)(sizeof(nvmlProcessDetailList_t) | (1u << 24)))

typedef struct simdev *nvmlDevice_t; /* opaque to callers: a pointer into g_devs */

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int version;
    unsigned int sensorType;
    int temperature;
} nvmlTemperature_t;

/* nvmlPciInfo_t (used by _v2 and _v3). */
typedef struct {
    char busIdLegacy[16]; /* "%04X:%02X:%02X.0" */
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32]; /* "%08X:%02X:%02X.0" */
} nvmlPciInfo_t;

/* The original (v1) nvmlPciInfo_t that the unversioned nvmlDeviceGetPciInfo fills. */
typedef struct {
    char busId[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    unsigned int reserved0, reserved1, reserved2, reserved3;
} nvmlPciInfo_v1_t;

/* Legacy process entry of the unversioned ...RunningProcesses symbols. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

/* nvmlProcessInfo_v2_t == nvmlProcessInfo_t (taken by both _v2 and _v3). */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

/*
 * nvmlProcessInfo_v3_t: what the _v3 process symbols wrote in R535 from
 * 535.43.02 to 535.86.x (the header's nvmlProcessInfo_t then, "without a
 * version bump"; nvitop PR 79).  From 535.104.05 on they write the 24-byte
 * nvmlProcessInfo_t again and the 32-byte entries moved to
 * nvmlDeviceGetRunningProcessDetailList.  Scenario key
 * process_v3_entry_bytes (24 or 32) chooses.
 */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
    unsigned long long usedGpuCcProtectedMemory;
} nvmlProcessInfo_v3_t;

/* nvmlDeviceGetRunningProcessDetailList (R535.104 and later): the same five fields, the same layout. */
typedef nvmlProcessInfo_v3_t nvmlProcessDetail_v1_t;

typedef struct {
    unsigned int version;             /* nvmlProcessDetailList_v1 */
    unsigned int mode;                /* NVML_PROCESS_MODE_* */
    unsigned int numProcArrayEntries; /* in: capacity of procArray; out: number of processes */
    nvmlProcessDetail_v1_t *procArray;
} nvmlProcessDetailList_t;

/*
 * nvmlGpuFabricInfo_t and nvmlGpuFabricInfo_v2_t/_v3_t (nvml.h; go-nvml pkg/nvml/nvml.h): the
 * state is an unsigned char (nvmlGpuFabricState_t), so the v1 struct is 28 bytes with padding and
 * healthMask sits at offset 32 of v2.  nvmlGpuFabricInfoV_t is v3 in NVML 12.5+ headers, v2 before.
 */
#define NVML_GPU_FABRIC_UUID_LEN 16
typedef struct {
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned char state;
} nvmlGpuFabricInfo_t;

typedef struct {
    unsigned int version;
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned char state;
    unsigned int healthMask;
    unsigned char healthSummary; /* v3 only */
} nvmlGpuFabricInfoV_t;

/* 0x02000024 and 0x03000028 */
#define NVML_GPU_FABRIC_INFO_V2_VERSION ((unsigned)(offsetof(nvmlGpuFabricInfoV_t, healthSummary) | (2u << 24)))
#define NVML_GPU_FABRIC_INFO_V3_VERSION ((unsigned)(sizeof(nvmlGpuFabricInfoV_t) | (3u << 24)))

/* nvmlDeviceGetConfComputeMemSizeInfo (R535 and later). */
typedef struct {
    unsigned long long protectedMemSizeKib;
    unsigned long long unprotectedMemSizeKib;
} nvmlConfComputeMemSizeInfo_t;

_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t layout");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t layout");
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t layout");
_Static_assert(sizeof(nvmlProcessInfo_v1_t) == 16, "nvmlProcessInfo_v1_t layout");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_t layout");
_Static_assert(sizeof(nvmlTemperature_t) == 12, "nvmlTemperature_t layout");
_Static_assert(sizeof(nvmlProcessInfo_v3_t) == 32, "nvmlProcessInfo_v3_t layout");
_Static_assert(sizeof(nvmlProcessDetail_v1_t) == 32, "nvmlProcessDetail_v1_t layout");
_Static_assert(offsetof(nvmlProcessDetail_v1_t, usedGpuCcProtectedMemory) ==
                   offsetof(nvmlProcessInfo_v3_t, usedGpuCcProtectedMemory) &&
                   offsetof(nvmlProcessDetail_v1_t, gpuInstanceId) == offsetof(nvmlProcessInfo_v3_t, gpuInstanceId),
               "nvmlProcessDetail_v1_t is nvmlProcessInfo_v3_t (put_process writes both)");
_Static_assert(sizeof(nvmlProcessDetailList_t) == 24, "nvmlProcessDetailList_t layout");
_Static_assert(sizeof(nvmlConfComputeMemSizeInfo_t) == 16, "nvmlConfComputeMemSizeInfo_t layout");
_Static_assert(sizeof(nvmlGpuFabricInfo_t) == 28, "nvmlGpuFabricInfo_t layout");
_Static_assert(offsetof(nvmlGpuFabricInfoV_t, healthMask) == 32 && sizeof(nvmlGpuFabricInfoV_t) == 40,
               "nvmlGpuFabricInfo_v2_t / _v3_t layout");

/* ---- the simulated state ------------------------------------------------ */

#define MAX_GPUS 64
#define MAX_MIG 7 /* MIG devices per GPU (nvmlDeviceGetMaxMigDeviceCount on an A100/H100/H200) */

/* Fields that `gpu.<i>.not_supported` can switch to NVML_ERROR_NOT_SUPPORTED. */
enum {
    NS_SERIAL = 1u << 0,
    NS_MEMORY = 1u << 1,
    NS_UTILIZATION = 1u << 2,
    NS_TEMPERATURE = 1u << 3,
    NS_POWER = 1u << 4,
    NS_POWER_LIMIT = 1u << 5,
    NS_FAN = 1u << 6,
    NS_PERSISTENCE = 1u << 7,
    NS_COMPUTE_MODE = 1u << 8,
    NS_MIG_MODE = 1u << 9,
    NS_PROCESSES = 1u << 10,
    NS_MINOR_NUMBER = 1u << 11,
    NS_ENCODER = 1u << 12,
    NS_DECODER = 1u << 13,
    NS_MEMORY_V1 = 1u << 14, /* nvmlDeviceGetMemoryInfo only */
    NS_MEMORY_V2 = 1u << 15, /* nvmlDeviceGetMemoryInfo_v2 only */
    NS_CONF_COMPUTE = 1u << 16,
    NS_REMAPPED_ROWS = 1u << 17, /* nvmlDeviceGetRemappedRows */
    NS_RETIRED_PAGES = 1u << 18, /* nvmlDeviceGetRetiredPagesPendingStatus */
    NS_ECC = 1u << 19,           /* nvmlDeviceGetEccMode, nvmlDeviceGetTotalEccErrors */
    NS_FABRIC = 1u << 20,        /* nvmlDeviceGetGpuFabricInfo, ...V */
    NS_CLOCK_REASONS = 1u << 21, /* nvmlDeviceGetCurrentClocksEventReasons, ...ThrottleReasons */
};

static const struct {
    const char *name;
    unsigned bit;
} NS_NAMES[] = {
    {"serial", NS_SERIAL},           {"memory", NS_MEMORY},
    {"utilization", NS_UTILIZATION}, {"temperature", NS_TEMPERATURE},
    {"power", NS_POWER},             {"power_limit", NS_POWER_LIMIT},
    {"fan", NS_FAN},                 {"persistence", NS_PERSISTENCE},
    {"compute_mode", NS_COMPUTE_MODE}, {"mig_mode", NS_MIG_MODE},
    {"processes", NS_PROCESSES},     {"minor_number", NS_MINOR_NUMBER},
    {"encoder", NS_ENCODER},         {"decoder", NS_DECODER},
    {"memory_v1", NS_MEMORY_V1},     {"memory_v2", NS_MEMORY_V2},
    {"conf_compute", NS_CONF_COMPUTE},
    {"remapped_rows", NS_REMAPPED_ROWS}, {"retired_pages", NS_RETIRED_PAGES},
    {"ecc", NS_ECC},                 {"fabric", NS_FABRIC},
    {"clock_reasons", NS_CLOCK_REASONS},
};

/* A MIG device: compute instance ci of GPU instance gi (scenario gpu.<i>.mig_devices gi:ci:profile:mib:uuid,...). */
struct mig {
    unsigned gi, ci;
    char profile[32];
    long long mem_mib;
    char uuid[80];
};

struct gpu {
    char name[96];
    char uuid[80];
    char serial[32];
    char bus_id[32];
    unsigned domain, bus, device;
    unsigned pci_device_id, pci_subsystem_id;
    unsigned minor;
    long long total_mib, reserved_mib, base_used_mib, leaked_mib;
    unsigned util_gpu, util_mem;
    int temperature;
    unsigned power_mw, power_limit_mw;
    int fan; /* < 0: no fan (NOT_SUPPORTED) */
    unsigned persistence, compute_mode, mig_current, mig_pending;
    long long lost_at_ns; /* CLOCK_MONOTONIC; < 0: never lost */
    /* health (README "Health"): row remapper, page retirement, ECC, fabric, clock event reasons */
    unsigned remap_corrected, remap_uncorrected, remap_pending, remap_failure;
    unsigned retired_pending;
    unsigned ecc_mode;
    unsigned long long ecc_volatile_corrected, ecc_volatile_uncorrected;
    int fabric_state;  /* NVML_GPU_FABRIC_STATE_*: 0 not supported, 1 not started, 2 in progress, 3 completed */
    int fabric_status; /* an nvmlReturn_t, meaningful once the state is completed */
    unsigned long long clock_reasons; /* nvmlClocksEventReason* bits */
    unsigned inforom_corrupt; /* nvmlDeviceValidateInforom answers NVML_ERROR_CORRUPTED_INFOROM */
    unsigned not_supported; /* NS_* bits */
    unsigned unknown;       /* NS_* bits whose queries answer NVML_ERROR_UNKNOWN (an intermittent driver error) */
    int nmig;
    struct mig mig[MAX_MIG];
};

enum { PID_MODE_TRANSLATE = 0, PID_MODE_HOST = 1 };

struct scenario {
    char driver_version[80];
    char nvml_version[80];
    int cuda_version;
    int init_error;
    int pid_mode;
    unsigned long long host_pidns;
    long long release_lag_ms;
    long long drain_ms; /* after the lag, a dead process's memory is released linearly over this long */
    long long unknown_every;
    long long call_delay_ms;
    unsigned process_v3_entry_bytes; /* sizeof(nvmlProcessInfo_t) or sizeof(nvmlProcessInfo_v3_t) */
    int gpu_count;
    struct gpu gpus[MAX_GPUS];
};

enum { T_COMPUTE = 1, T_GRAPHICS = 2, T_MPS = 4 };

struct proc_line { /* proc <hostpid> <starttime> <gpu> <types> <used_mib> <pidns> <nspid> [<gi> <ci>] */
    int pid;
    int gi, ci; /* the MIG device (-1 -1: the whole GPU) */
    unsigned long long starttime;
    int gpu;
    unsigned types;
    long long used_mib; /* -1: not available */
    unsigned long long pidns;
    int nspid;
};

struct exit_line { /* exit <hostpid> <starttime> <exit_monotonic_ns> */
    int pid;
    unsigned long long starttime;
    long long exit_ns;
};

/* Identity of a file version: re-read only when it changes. */
struct filekey {
    int present;
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtim;
};

struct simdev {
    unsigned index;
    int mig; /* -1: the GPU; else the slot of a MIG device of GPU index (g_migdevs) */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct simdev g_devs[MAX_GPUS];     /* device handles point here */
static struct simdev g_migdevs[MAX_GPUS][MAX_MIG]; /* MIG device handles */
static int g_refcount;                     /* nvmlInit/nvmlShutdown nesting */
static char g_dir[PATH_MAX];               /* DIR, found at the first nvmlInit */
static char g_scenario_path[PATH_MAX + 16];
static char g_procs_path[PATH_MAX + 16];
static struct scenario g_sc;               /* valid when g_sc_loaded */
static int g_sc_loaded;
static struct filekey g_sc_key, g_procs_key;
static struct proc_line *g_procs;
static size_t g_nprocs, g_procs_cap;
static struct exit_line *g_exits;
static size_t g_nexits, g_exits_cap;
static unsigned long long g_self_pidns; /* the caller's PID namespace inode; 0 = not known yet */
static unsigned long long g_device_calls; /* per-process counter for unknown_every */

/* ---- small helpers ------------------------------------------------------ */

static long long mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void sleep_ms(long long ms)
{
    if (ms <= 0)
        return;
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
}

static void copy_str(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* Copy a string result into a caller buffer: INSUFFICIENT_SIZE when it does not fit (NVML semantics). */
static nvmlReturn_t put_str(char *dst, unsigned length, const char *src)
{
    size_t n = strlen(src);
    if ((size_t)length < n + 1)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, n + 1);
    return NVML_SUCCESS;
}

/* Integers are decimal; a 0x prefix is accepted too. */
static long long parse_int(const char *s, long long dflt)
{
    char *end;
    errno = 0;
    while (*s == ' ' || *s == '\t')
        s++;
    long long v = (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) ? strtoll(s, &end, 16) : strtoll(s, &end, 10);
    if (end == s || errno)
        return dflt;
    return v;
}

static unsigned long long parse_u64(const char *s, unsigned long long dflt)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || errno)
        return dflt;
    return v;
}

/* Read a whole file; returns a malloc'd NUL-terminated buffer and fills *key from fstat. */
static char *read_file(const char *path, struct filekey *key)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return NULL;
    }
    size_t cap = (size_t)st.st_size + 1, len = 0;
    char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return NULL;
    }
    for (;;) {
        if (len + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                close(fd);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + len, cap - 1 - len);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            free(buf);
            close(fd);
            return NULL;
        }
        if (r == 0)
            break;
        len += (size_t)r;
    }
    buf[len] = '\0';
    close(fd);
    key->present = 1;
    key->dev = st.st_dev;
    key->ino = st.st_ino;
    key->size = st.st_size;
    key->mtim = st.st_mtim;
    return buf;
}

static int key_matches(const struct filekey *k, const struct stat *st)
{
    return k->present && k->dev == st->st_dev && k->ino == st->st_ino && k->size == st->st_size &&
           k->mtim.tv_sec == st->st_mtim.tv_sec && k->mtim.tv_nsec == st->st_mtim.tv_nsec;
}

static uint32_t fnv1a(const char *s, uint32_t h)
{
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 16777619u;
    }
    return h;
}

/* ---- DIR ---------------------------------------------------------------- */

static void find_dir(void)
{
    const char *env = getenv("GPUSIM_DIR");
    char path[PATH_MAX];
    if (env && *env) {
        copy_str(path, sizeof path, env);
    } else {
        /* DIR/lib/libnvidia-ml.so.1 -> DIR.  dli_fname is the path the loader
         * used (e.g. from LD_LIBRARY_PATH); it may be relative to the cwd. */
        Dl_info info;
        path[0] = '\0';
        if (dladdr((void *)&find_dir, &info) && info.dli_fname) {
            if (info.dli_fname[0] == '/') {
                copy_str(path, sizeof path, info.dli_fname);
            } else {
                char cwd[PATH_MAX];
                if (getcwd(cwd, sizeof cwd))
                    snprintf(path, sizeof path, "%.2000s/%.2000s", cwd, info.dli_fname);
                else
                    copy_str(path, sizeof path, info.dli_fname);
            }
            for (int i = 0; i < 2; i++) { /* strip the file name, then "lib" */
                char *slash = strrchr(path, '/');
                if (slash == path)
                    path[1] = '\0';
                else if (slash)
                    *slash = '\0';
            }
        }
    }
    if (strcmp(path, g_dir) != 0) {
        copy_str(g_dir, sizeof g_dir, path);
        snprintf(g_scenario_path, sizeof g_scenario_path, "%s/scenario", g_dir);
        snprintf(g_procs_path, sizeof g_procs_path, "%s/procs", g_dir);
        memset(&g_sc_key, 0, sizeof g_sc_key);
        memset(&g_procs_key, 0, sizeof g_procs_key);
        g_sc_loaded = 0;
        g_nprocs = g_nexits = 0;
    }
}

static unsigned long long self_pidns(void)
{
    if (!g_self_pidns) {
        struct stat st;
        if (stat("/proc/self/ns/pid", &st) == 0)
            g_self_pidns = (unsigned long long)st.st_ino;
    }
    return g_self_pidns;
}

/* ---- the scenario file -------------------------------------------------- */

static const unsigned HGX_BUSES[8] = {0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB};

static void set_bus_id(struct gpu *g, const char *s)
{
    unsigned d, b, dev, fn;
    if (sscanf(s, "%x:%x:%x.%x", &d, &b, &dev, &fn) == 4) {
        g->domain = d;
        g->bus = b;
        g->device = dev;
        snprintf(g->bus_id, sizeof g->bus_id, "%08X:%02X:%02X.0", d, b & 0xFF, dev & 0xFF);
    }
}

static void default_gpu(struct gpu *g, unsigned i, int count)
{
    memset(g, 0, sizeof *g);
    copy_str(g->name, sizeof g->name, "NVIDIA H200");
    char seed[PATH_MAX + 16];
    snprintf(seed, sizeof seed, "%s/%u", g_dir, i);
    uint32_t h1 = fnv1a(seed, 2166136261u), h2 = fnv1a(seed, h1), h3 = fnv1a(seed, h2), h4 = fnv1a(seed, h3);
    snprintf(g->uuid, sizeof g->uuid, "GPU-%08x-%04x-%04x-%04x-%04x%08x", h1, h2 >> 16, h2 & 0xFFFF, h3 >> 16,
             h3 & 0xFFFF, h4);
    snprintf(g->serial, sizeof g->serial, "16540%08u", h4 % 100000000u);
    unsigned bus = (count <= 8 && i < 8) ? HGX_BUSES[i] : 0x10 + 3 * i;
    char bid[32];
    snprintf(bid, sizeof bid, "00000000:%02X:00.0", bus & 0xFF);
    set_bus_id(g, bid);
    g->pci_device_id = 0x233510DEu;
    g->pci_subsystem_id = 0x18BE10DEu;
    g->minor = i;
    g->total_mib = 143771;
    g->temperature = 31;
    g->power_mw = 76000;
    g->power_limit_mw = 700000;
    g->fan = -1;
    g->persistence = 1;
    g->lost_at_ns = -1;
    g->ecc_mode = 1;
    g->fabric_state = 3;    /* an HGX board whose fabric manager has registered the GPU */
    g->clock_reasons = 0x1; /* nvmlClocksEventReasonGpuIdle */
}

static void set_gpu_field(struct gpu *g, const char *f, const char *v)
{
    if (!strcmp(f, "name"))
        copy_str(g->name, sizeof g->name, v);
    else if (!strcmp(f, "uuid"))
        copy_str(g->uuid, sizeof g->uuid, v);
    else if (!strcmp(f, "serial"))
        copy_str(g->serial, sizeof g->serial, v);
    else if (!strcmp(f, "pci_bus_id"))
        set_bus_id(g, v);
    else if (!strcmp(f, "pci_device_id"))
        g->pci_device_id = (unsigned)parse_int(v, g->pci_device_id);
    else if (!strcmp(f, "pci_subsystem_id"))
        g->pci_subsystem_id = (unsigned)parse_int(v, g->pci_subsystem_id);
    else if (!strcmp(f, "minor"))
        g->minor = (unsigned)parse_int(v, g->minor);
    else if (!strcmp(f, "memory_total_mib"))
        g->total_mib = parse_int(v, g->total_mib);
    else if (!strcmp(f, "memory_reserved_mib"))
        g->reserved_mib = parse_int(v, g->reserved_mib);
    else if (!strcmp(f, "base_used_mib"))
        g->base_used_mib = parse_int(v, g->base_used_mib);
    else if (!strcmp(f, "leaked_mib"))
        g->leaked_mib = parse_int(v, g->leaked_mib);
    else if (!strcmp(f, "util_gpu"))
        g->util_gpu = (unsigned)parse_int(v, g->util_gpu);
    else if (!strcmp(f, "util_mem"))
        g->util_mem = (unsigned)parse_int(v, g->util_mem);
    else if (!strcmp(f, "temperature"))
        g->temperature = (int)parse_int(v, g->temperature);
    else if (!strcmp(f, "power_mw"))
        g->power_mw = (unsigned)parse_int(v, g->power_mw);
    else if (!strcmp(f, "power_limit_mw"))
        g->power_limit_mw = (unsigned)parse_int(v, g->power_limit_mw);
    else if (!strcmp(f, "fan"))
        g->fan = (int)parse_int(v, g->fan);
    else if (!strcmp(f, "persistence"))
        g->persistence = (unsigned)parse_int(v, g->persistence);
    else if (!strcmp(f, "compute_mode"))
        g->compute_mode = (unsigned)parse_int(v, g->compute_mode);
    else if (!strcmp(f, "mig_current"))
        g->mig_current = (unsigned)parse_int(v, g->mig_current);
    else if (!strcmp(f, "mig_pending"))
        g->mig_pending = (unsigned)parse_int(v, g->mig_pending);
    else if (!strcmp(f, "mig_devices")) {
        g->nmig = 0;
        char buf[1024];
        copy_str(buf, sizeof buf, v);
        char *save = NULL;
        for (char *e = strtok_r(buf, ",", &save); e && g->nmig < MAX_MIG; e = strtok_r(NULL, ",", &save)) {
            struct mig m;
            memset(&m, 0, sizeof m);
            if (sscanf(e, "%u:%u:%31[^:]:%lld:%79s", &m.gi, &m.ci, m.profile, &m.mem_mib, m.uuid) == 5)
                g->mig[g->nmig++] = m;
        }
    }
    else if (!strcmp(f, "lost_at_ns"))
        g->lost_at_ns = parse_int(v, g->lost_at_ns);
    else if (!strcmp(f, "remap_corrected"))
        g->remap_corrected = (unsigned)parse_int(v, g->remap_corrected);
    else if (!strcmp(f, "remap_uncorrected"))
        g->remap_uncorrected = (unsigned)parse_int(v, g->remap_uncorrected);
    else if (!strcmp(f, "remap_pending"))
        g->remap_pending = (unsigned)parse_int(v, g->remap_pending);
    else if (!strcmp(f, "remap_failure"))
        g->remap_failure = (unsigned)parse_int(v, g->remap_failure);
    else if (!strcmp(f, "retired_pending"))
        g->retired_pending = (unsigned)parse_int(v, g->retired_pending);
    else if (!strcmp(f, "inforom_corrupt"))
        g->inforom_corrupt = (unsigned)parse_int(v, g->inforom_corrupt);
    else if (!strcmp(f, "ecc_mode"))
        g->ecc_mode = (unsigned)parse_int(v, g->ecc_mode);
    else if (!strcmp(f, "ecc_volatile_corrected"))
        g->ecc_volatile_corrected = parse_u64(v, g->ecc_volatile_corrected);
    else if (!strcmp(f, "ecc_volatile_uncorrected"))
        g->ecc_volatile_uncorrected = parse_u64(v, g->ecc_volatile_uncorrected);
    else if (!strcmp(f, "fabric_state"))
        g->fabric_state = (int)parse_int(v, g->fabric_state);
    else if (!strcmp(f, "fabric_status"))
        g->fabric_status = (int)parse_int(v, g->fabric_status);
    else if (!strcmp(f, "clock_reasons"))
        g->clock_reasons = (unsigned long long)parse_int(v, (long long)g->clock_reasons);
    else if (!strcmp(f, "not_supported") || !strcmp(f, "unknown")) {
        unsigned *bits = !strcmp(f, "unknown") ? &g->unknown : &g->not_supported;
        *bits = 0;
        char tmp[512];
        copy_str(tmp, sizeof tmp, v);
        char *save = NULL;
        for (char *tok = strtok_r(tmp, ", \t", &save); tok; tok = strtok_r(NULL, ", \t", &save))
            for (size_t k = 0; k < sizeof NS_NAMES / sizeof NS_NAMES[0]; k++)
                if (!strcmp(tok, NS_NAMES[k].name))
                    *bits |= NS_NAMES[k].bit;
    }
    /* unknown fields are ignored (forward compatible) */
}

static void parse_scenario(char *buf, struct scenario *sc)
{
    memset(sc, 0, sizeof *sc);
    copy_str(sc->driver_version, sizeof sc->driver_version, "580.159.03");
    copy_str(sc->nvml_version, sizeof sc->nvml_version, "13.580.159.03");
    sc->cuda_version = 13000;
    sc->pid_mode = PID_MODE_TRANSLATE;
    sc->process_v3_entry_bytes = sizeof(nvmlProcessInfo_t);

    /* gpu_count decides the default bus numbers, so find it first. */
    int count = 0;
    for (char *p = strstr(buf, "gpu_count "); p; p = strstr(p + 1, "gpu_count "))
        if (p == buf || p[-1] == '\n')
            count = (int)parse_int(p + 10, 0);
    if (count < 0)
        count = 0;
    if (count > MAX_GPUS)
        count = MAX_GPUS;
    sc->gpu_count = count;
    for (int i = 0; i < MAX_GPUS; i++)
        default_gpu(&sc->gpus[i], (unsigned)i, count);

    char *save = NULL;
    for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        size_t n = strlen(line);
        while (n && isspace((unsigned char)line[n - 1])) /* \r and trailing blanks */
            line[--n] = '\0';
        if (!n || line[0] == '#')
            continue;
        char *sp = strchr(line, ' ');
        const char *val = "";
        if (sp) {
            *sp = '\0';
            val = sp + 1; /* the rest of the line: may contain spaces (GPU names) */
        }
        const char *key = line;
        if (!strncmp(key, "gpu.", 4)) {
            char *end;
            long i = strtol(key + 4, &end, 10);
            if (end != key + 4 && *end == '.' && i >= 0 && i < MAX_GPUS)
                set_gpu_field(&sc->gpus[i], end + 1, val);
        } else if (!strcmp(key, "driver_version"))
            copy_str(sc->driver_version, sizeof sc->driver_version, val);
        else if (!strcmp(key, "nvml_version"))
            copy_str(sc->nvml_version, sizeof sc->nvml_version, val);
        else if (!strcmp(key, "cuda_version"))
            sc->cuda_version = (int)parse_int(val, sc->cuda_version);
        else if (!strcmp(key, "init_error"))
            sc->init_error = (int)parse_int(val, 0);
        else if (!strcmp(key, "pid_mode"))
            sc->pid_mode = !strcmp(val, "host") ? PID_MODE_HOST : PID_MODE_TRANSLATE;
        else if (!strcmp(key, "host_pidns"))
            sc->host_pidns = parse_u64(val, 0);
        else if (!strcmp(key, "release_lag_ms"))
            sc->release_lag_ms = parse_int(val, 0);
        else if (!strcmp(key, "drain_ms"))
            sc->drain_ms = parse_int(val, 0);
        else if (!strcmp(key, "unknown_every"))
            sc->unknown_every = parse_int(val, 0);
        else if (!strcmp(key, "call_delay_ms"))
            sc->call_delay_ms = parse_int(val, 0);
        else if (!strcmp(key, "process_v3_entry_bytes"))
            sc->process_v3_entry_bytes = parse_int(val, 0) == (long long)sizeof(nvmlProcessInfo_v3_t)
                                             ? sizeof(nvmlProcessInfo_v3_t)
                                             : sizeof(nvmlProcessInfo_t); /* anything else: 24 */
        /* version, gpu_count (done above), hidden_symbols (read by `gpusim`), driver_profile (a
         * name for people), unknown keys: ignored */
    }
}

/*
 * Re-read DIR/scenario if it changed.  Returns 0 when the scenario is there
 * and loaded, -1 when it cannot be stat'ed or read (the last good state is
 * kept for already initialized callers; nvmlInit reports DRIVER_NOT_LOADED).
 */
static int refresh_scenario(void)
{
    static struct scenario tmp; /* big: keep it off the stack; used under g_lock only */
    struct stat st;
    if (stat(g_scenario_path, &st) != 0)
        return -1;
    if (g_sc_loaded && key_matches(&g_sc_key, &st))
        return 0;
    struct filekey key;
    char *buf = read_file(g_scenario_path, &key);
    if (!buf)
        return -1;
    parse_scenario(buf, &tmp);
    free(buf);
    g_sc = tmp;
    g_sc_key = key;
    g_sc_loaded = 1;
    return 0;
}

/* ---- the procs file ----------------------------------------------------- */

static void parse_procs(char *buf)
{
    g_nprocs = g_nexits = 0;
    char *save = NULL;
    for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (!strncmp(line, "proc ", 5)) {
            struct proc_line p;
            char types[16];
            int got = sscanf(line + 5, "%d %llu %d %15s %lld %llu %d %d %d", &p.pid, &p.starttime, &p.gpu, types,
                             &p.used_mib, &p.pidns, &p.nspid, &p.gi, &p.ci);
            if (got == 7)
                p.gi = p.ci = -1;
            else if (got != 9)
                continue;
            p.types = 0;
            for (const char *t = types; *t; t++)
                p.types |= *t == 'C' ? T_COMPUTE : *t == 'G' ? T_GRAPHICS : *t == 'M' ? T_MPS : 0;
            if (g_nprocs == g_procs_cap) {
                size_t cap = g_procs_cap ? g_procs_cap * 2 : 64;
                struct proc_line *np = realloc(g_procs, cap * sizeof *np);
                if (!np)
                    continue;
                g_procs = np;
                g_procs_cap = cap;
            }
            g_procs[g_nprocs++] = p;
        } else if (!strncmp(line, "exit ", 5)) {
            struct exit_line e;
            if (sscanf(line + 5, "%d %llu %lld", &e.pid, &e.starttime, &e.exit_ns) != 3)
                continue;
            if (g_nexits == g_exits_cap) {
                size_t cap = g_exits_cap ? g_exits_cap * 2 : 64;
                struct exit_line *ne = realloc(g_exits, cap * sizeof *ne);
                if (!ne)
                    continue;
                g_exits = ne;
                g_exits_cap = cap;
            }
            g_exits[g_nexits++] = e;
        }
    }
}

/* Re-read DIR/procs if it changed; a missing file means no process at all. */
static void refresh_procs(void)
{
    struct stat st;
    if (stat(g_procs_path, &st) != 0) {
        g_procs_key.present = 0;
        g_nprocs = g_nexits = 0;
        return;
    }
    if (key_matches(&g_procs_key, &st))
        return;
    struct filekey key;
    char *buf = read_file(g_procs_path, &key);
    if (!buf) {
        g_procs_key.present = 0;
        g_nprocs = g_nexits = 0;
        return;
    }
    parse_procs(buf);
    free(buf);
    g_procs_key = key;
}

/* ---- process rules (README: "Rules the library applies to a proc line") - */

/*
 * Is <pid> (a pid in the caller's /proc) the process that started at
 * <starttime>, and not a zombie?  comm (field 2) may contain spaces and ')',
 * so split after the LAST ')': the tokens after it start at field 3 (state),
 * and field 22 (starttime) is the 20th of them.
 */
/*
 * A thread-group leader in state Z whose other threads still run is a live process (only its
 * main thread exited; proc(5): /proc/<pid>/task lists the live threads): the driver keeps its
 * contexts, as it does for any process that has not exited.
 */
static int other_threads_run(int pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", pid);
    DIR *d = opendir(path);
    if (!d)
        return 0;
    int others = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.' && atoi(e->d_name) != pid)
            others++;
    closedir(d);
    return others > 0;
}

static int pid_alive(int pid, unsigned long long starttime)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *rp = strrchr(buf, ')');
    if (!rp)
        return 0;
    char *save = NULL, *tok;
    int field = 3;
    char state = '?';
    for (tok = strtok_r(rp + 1, " ", &save); tok; tok = strtok_r(NULL, " ", &save), field++) {
        if (field == 3)
            state = tok[0];
        else if (field == 22) {
            if (parse_u64(tok, 0) != starttime || state == 'X')
                return 0;
            return state != 'Z' || other_threads_run(pid);
        }
    }
    return 0;
}

static const struct exit_line *find_exit(const struct proc_line *p)
{
    for (size_t i = 0; i < g_nexits; i++)
        if (g_exits[i].pid == p->pid && g_exits[i].starttime == p->starttime)
            return &g_exits[i];
    return NULL;
}

static int caller_is_host(void)
{
    return g_sc.host_pidns && self_pidns() == g_sc.host_pidns;
}

/* Rule 1. */
static int proc_alive(const struct proc_line *p)
{
    if (caller_is_host())
        return pid_alive(p->pid, p->starttime);
    if (self_pidns() == p->pidns)
        return pid_alive(p->nspid, p->starttime);
    return find_exit(p) == NULL; /* the caller cannot see it: trust the daemon */
}

/* Rule 2: the pid the caller sees, or -1 when it is not reported. */
static long reported_pid(const struct proc_line *p)
{
    if (g_sc.pid_mode == PID_MODE_HOST)
        return p->pid; /* old drivers: host pids to everyone */
    if (caller_is_host())
        return p->pid;
    if (self_pidns() == p->pidns)
        return p->nspid;
    return -1; /* new drivers drop processes the caller cannot see */
}

/*
 * Rule 3: memory of a dead process counts in full until exit_ns + release_lag_ms ("now" when no
 * exit line yet); then, with drain_ms > 0, it is released linearly over drain_ms (the teardown of
 * a large context with pinned host memory: README "Draining"), else at once.  Returns the MiB
 * still counted.
 */
static long long dead_counted_mib(const struct proc_line *p, long long now)
{
    if (p->used_mib <= 0)
        return 0;
    const struct exit_line *e = find_exit(p);
    long long exit_ns = e ? e->exit_ns : now;
    long long start = exit_ns + g_sc.release_lag_ms * 1000000LL;
    if (now < start)
        return p->used_mib;
    long long drain_ns = g_sc.drain_ms * 1000000LL;
    if (drain_ns <= 0 || now - start >= drain_ns)
        return 0;
    long double left = (long double)(drain_ns - (now - start)) / (long double)drain_ns;
    long long mib = (long long)((long double)p->used_mib * left + 0.5L);
    return mib > 0 ? mib : 0;
}

struct seen_proc {
    unsigned pid;
    unsigned long long used_bytes;
    unsigned gi, ci; /* NVML_INVALID_INSTANCE_ID when MIG is off */
};

/*
 * Judge every proc line of GPU <gpu> (of its MIG device <m> only, when m != NULL).  Returns the MiB
 * counted towards `used` and, when out != NULL, fills out[] (capacity g_nprocs) with the processes
 * of <types> reported to the caller; *nout gets their number.
 */
static long long scan_gpu(unsigned gpu, const struct mig *m, unsigned types, struct seen_proc *out, size_t *nout)
{
    long long used = 0, now = -1;
    size_t n = 0;
    int mig_on = g_sc.gpus[gpu].mig_current != 0;
    for (size_t i = 0; i < g_nprocs; i++) {
        const struct proc_line *p = &g_procs[i];
        if (p->gpu != (int)gpu)
            continue;
        if (m && (p->gi != (int)m->gi || p->ci != (int)m->ci))
            continue;
        int alive = proc_alive(p);
        if (!alive) {
            if (now < 0)
                now = mono_ns();
            used += dead_counted_mib(p, now);
            continue; /* never reported */
        }
        if (p->used_mib > 0)
            used += p->used_mib;
        if (out && (p->types & types)) {
            long pid = reported_pid(p);
            if (pid >= 0) {
                out[n].pid = (unsigned)pid;
                out[n].used_bytes = p->used_mib < 0 ? NVML_VALUE_NOT_AVAILABLE_ULL
                                                    : (unsigned long long)p->used_mib * 1048576ULL;
                out[n].gi = mig_on && p->gi >= 0 ? (unsigned)p->gi : NVML_INVALID_INSTANCE_ID;
                out[n].ci = mig_on && p->ci >= 0 ? (unsigned)p->ci : NVML_INVALID_INSTANCE_ID;
                n++;
            }
        }
    }
    if (nout)
        *nout = n;
    return used;
}

/* ---- call protocol ------------------------------------------------------ */

/*
 * Every entry point (but nvmlErrorString) runs
 *     enter() ... leave(ret)
 * enter() takes g_lock and re-reads the scenario if it changed; leave()
 * drops the lock and then sleeps call_delay_ms, so a delayed call does not
 * block other threads.
 */
static nvmlReturn_t enter(void)
{
    pthread_mutex_lock(&g_lock);
    if (g_refcount <= 0)
        return NVML_ERROR_UNINITIALIZED;
    refresh_scenario();
    return NVML_SUCCESS;
}

static nvmlReturn_t leave(nvmlReturn_t ret)
{
    long long delay = g_sc_loaded ? g_sc.call_delay_ms : 0;
    pthread_mutex_unlock(&g_lock);
    sleep_ms(delay);
    return ret;
}

enum { QUERY = 0, IDENTITY = 1 };

/*
 * The common prologue of device calls (calls that take a device handle).
 * Order of checks: initialized, valid handle, non-NULL arguments,
 * unknown_every, lost GPU (static identity queries excepted), unknown, not_supported.
 * Called with g_lock held (after enter()); on success *out is the GPU.
 */
static nvmlReturn_t device_check(nvmlDevice_t h, int args_ok, int kind, unsigned ns_bit, const struct gpu **out)
{
    if (!h || h < g_devs || h >= g_devs + MAX_GPUS || (size_t)(h - g_devs) >= (size_t)g_sc.gpu_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!args_ok)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct gpu *g = &g_sc.gpus[h - g_devs];
    g_device_calls++;
    if (g_sc.unknown_every > 0 && g_device_calls % (unsigned long long)g_sc.unknown_every == 0)
        return NVML_ERROR_UNKNOWN;
    if (kind != IDENTITY && g->lost_at_ns >= 0 && mono_ns() >= g->lost_at_ns)
        return NVML_ERROR_GPU_IS_LOST;
    if (g->unknown & ns_bit)
        return NVML_ERROR_UNKNOWN;
    if (g->not_supported & ns_bit)
        return NVML_ERROR_NOT_SUPPORTED;
    *out = g;
    return NVML_SUCCESS;
}

/*
 * A MIG device handle (README "MIG"): valid while its GPU is in MIG mode and has a MIG device in
 * that slot.  *out is the parent GPU, *mout the MIG device.  Other checks as device_check.
 */
static int is_mig_handle(nvmlDevice_t h)
{
    return h && h >= &g_migdevs[0][0] && h < &g_migdevs[0][0] + MAX_GPUS * MAX_MIG;
}

static nvmlReturn_t mig_check(nvmlDevice_t h, int args_ok, int kind, unsigned ns_bit, const struct gpu **out,
                              const struct mig **mout)
{
    *mout = NULL;
    if (!is_mig_handle(h))
        return device_check(h, args_ok, kind, ns_bit, out);
    if ((int)h->index >= g_sc.gpu_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct gpu *g = &g_sc.gpus[h->index];
    if (!g->mig_current || h->mig >= g->nmig)
        return NVML_ERROR_INVALID_ARGUMENT; /* the MIG device is gone (assumed: INVALID_ARGUMENT) */
    nvmlReturn_t ret = device_check(&g_devs[h->index], args_ok, kind, ns_bit, out);
    if (ret == NVML_SUCCESS)
        *mout = &g->mig[h->mig];
    return ret;
}

/* The prologue of calls that take a GPU or a MIG device handle: g (the GPU) and m (NULL for a GPU handle). */
#define MIG_CALL(h, args_ok, kind, ns_bit)                                                                       \
    const struct gpu *g = NULL;                                                                                  \
    const struct mig *m = NULL;                                                                                  \
    nvmlReturn_t ret = enter();                                                                                  \
    if (ret == NVML_SUCCESS)                                                                                     \
        ret = mig_check((h), (args_ok), (kind), (ns_bit), &g, &m);                                               \
    if (ret != NVML_SUCCESS)                                                                                     \
        return leave(ret);

#define DEVICE_CALL(h, args_ok, kind, ns_bit)                                                                    \
    const struct gpu *g = NULL;                                                                                  \
    nvmlReturn_t ret = enter();                                                                                  \
    if (ret == NVML_SUCCESS)                                                                                     \
        ret = device_check((h), (args_ok), (kind), (ns_bit), &g);                                                \
    if (ret != NVML_SUCCESS)                                                                                     \
        return leave(ret);

/* fork(): keep the lock consistent; the child is a new process (own counter, maybe another pidns). */
static void atfork_prepare(void) { pthread_mutex_lock(&g_lock); }
static void atfork_parent(void) { pthread_mutex_unlock(&g_lock); }
static void atfork_child(void)
{
    g_device_calls = 0;
    g_self_pidns = 0;
    pthread_mutex_unlock(&g_lock);
}

__attribute__((constructor)) static void lib_init(void)
{
    for (unsigned i = 0; i < MAX_GPUS; i++) {
        g_devs[i].index = i;
        g_devs[i].mig = -1;
        for (int k = 0; k < MAX_MIG; k++) {
            g_migdevs[i][k].index = i;
            g_migdevs[i][k].mig = k;
        }
    }
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* ---- init / shutdown / errors ------------------------------------------- */

static nvmlReturn_t do_init(void)
{
    pthread_mutex_lock(&g_lock);
    if (g_refcount <= 0) {
        find_dir();
        g_self_pidns = 0;
    }
    nvmlReturn_t ret;
    if (refresh_scenario() != 0)
        ret = NVML_ERROR_DRIVER_NOT_LOADED; /* no scenario: as if the kernel module were missing */
    else if (g_sc.init_error != 0)
        ret = g_sc.init_error;
    else {
        g_refcount++;
        ret = NVML_SUCCESS;
    }
    return leave(ret);
}

NVMLAPI nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
NVMLAPI nvmlReturn_t nvmlInit(void) { return do_init(); }
NVMLAPI nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags; /* NO_GPUS / NO_ATTACH / FORCE_INIT: no difference here */
    return do_init();
}

NVMLAPI nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t ret = enter();
    if (ret == NVML_SUCCESS)
        g_refcount--;
    return leave(ret);
}

NVMLAPI const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupt request issue";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "The operating system has blocked the request.";
    case 18: return "Driver/library version mismatch";
    case 19: return "In use by another client";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    case 22: return "The requested vgpu operation is not available on target device, because ECC is enabled";
    case 23: return "Ran out of critical resources, other than memory";
    case 24: return "Ran out of critical resources, other than memory";
    case 25: return "Argument version mismatch";
    case 26: return "The requested functionality has been deprecated";
    case 27: return "System is not ready for the request";
    case 28: return "No GPUs were found";
    case 29: return "Resource is in invalid state";
    case 999: return "Unknown Error";
    default: return "Unknown Error";
    }
}

/* ---- system queries ----------------------------------------------------- */

NVMLAPI nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    nvmlReturn_t ret = enter();
    if (ret == NVML_SUCCESS)
        ret = version ? put_str(version, length, g_sc.driver_version) : NVML_ERROR_INVALID_ARGUMENT;
    return leave(ret);
}

NVMLAPI nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    nvmlReturn_t ret = enter();
    if (ret == NVML_SUCCESS)
        ret = version ? put_str(version, length, g_sc.nvml_version) : NVML_ERROR_INVALID_ARGUMENT;
    return leave(ret);
}

NVMLAPI nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    nvmlReturn_t ret = enter();
    if (ret == NVML_SUCCESS) {
        if (!cudaDriverVersion)
            ret = NVML_ERROR_INVALID_ARGUMENT;
        else
            *cudaDriverVersion = g_sc.cuda_version;
    }
    return leave(ret);
}

NVMLAPI nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/*
 * The process's argv[0] as it was started (like the real library, e.g.
 * "/usr/bin/python3" or "python"), from /proc/<pid>/cmdline of the caller's
 * /proc; comm when cmdline is empty (kernel threads, zombies).  Truncated to
 * length-1 characters.
 */
NVMLAPI nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length)
{
    nvmlReturn_t ret = enter();
    if (ret != NVML_SUCCESS)
        return leave(ret);
    if (!name || length == 0)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    char path[64], buf[4096];
    ssize_t n = -1;
    snprintf(path, sizeof path, "/proc/%u/cmdline", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        n = read(fd, buf, sizeof buf - 1);
        close(fd);
    }
    if (n > 0) {
        buf[n] = '\0'; /* argv[0] ends at the first NUL */
    } else {
        snprintf(path, sizeof path, "/proc/%u/comm", pid);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return leave(NVML_ERROR_NOT_FOUND);
        n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n <= 0)
            return leave(NVML_ERROR_NOT_FOUND);
        buf[n] = '\0';
        buf[strcspn(buf, "\n")] = '\0';
    }
    copy_str(name, length, buf);
    return leave(NVML_SUCCESS);
}

/* ---- device enumeration ------------------------------------------------- */

NVMLAPI nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    nvmlReturn_t ret = enter();
    if (ret == NVML_SUCCESS) {
        if (!deviceCount)
            ret = NVML_ERROR_INVALID_ARGUMENT;
        else
            *deviceCount = (unsigned)g_sc.gpu_count;
    }
    return leave(ret);
}

NVMLAPI nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) { return nvmlDeviceGetCount_v2(deviceCount); }

/* A lost GPU still has a handle (as on real hosts: the handle works, its queries fail). */
NVMLAPI nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    nvmlReturn_t ret = enter();
    if (ret == NVML_SUCCESS) {
        if (!device || index >= (unsigned)g_sc.gpu_count)
            ret = NVML_ERROR_INVALID_ARGUMENT;
        else
            *device = &g_devs[index];
    }
    return leave(ret);
}

NVMLAPI nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

NVMLAPI nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    nvmlReturn_t ret = enter();
    if (ret != NVML_SUCCESS)
        return leave(ret);
    if (!uuid || !device)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < g_sc.gpu_count; i++) {
        if (!strcasecmp(uuid, g_sc.gpus[i].uuid)) {
            *device = &g_devs[i];
            return leave(NVML_SUCCESS);
        }
        for (int k = 0; g_sc.gpus[i].mig_current && k < g_sc.gpus[i].nmig; k++)
            if (!strcasecmp(uuid, g_sc.gpus[i].mig[k].uuid)) { /* a MIG UUID gives the MIG device's handle */
                *device = &g_migdevs[i][k];
                return leave(NVML_SUCCESS);
            }
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

/* Accepts "00000000:18:00.0", "0000:18:00.0" and lower case. */
NVMLAPI nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    nvmlReturn_t ret = enter();
    if (ret != NVML_SUCCESS)
        return leave(ret);
    if (!pciBusId || !device)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned d, b, dev, fn;
    if (sscanf(pciBusId, "%x:%x:%x.%x", &d, &b, &dev, &fn) != 4)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < g_sc.gpu_count; i++) {
        const struct gpu *g = &g_sc.gpus[i];
        if (g->domain == d && g->bus == b && g->device == dev && fn == 0) {
            *device = &g_devs[i];
            return leave(NVML_SUCCESS);
        }
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

NVMLAPI nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

/* ---- static identity (still answered on a lost GPU) --------------------- */

/* A MIG device's name: the GPU's and its profile, "NVIDIA H200 MIG 3g.71gb" (assumed from nvidia-smi -L's lines). */
NVMLAPI nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    MIG_CALL(device, name != NULL, IDENTITY, 0);
    if (m) {
        char buf[160];
        snprintf(buf, sizeof buf, "%s MIG %s", g->name, m->profile);
        return leave(put_str(name, length, buf));
    }
    return leave(put_str(name, length, g->name));
}

NVMLAPI nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    MIG_CALL(device, uuid != NULL, IDENTITY, 0);
    return leave(put_str(uuid, length, m ? m->uuid : g->uuid));
}

NVMLAPI nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    DEVICE_CALL(device, serial != NULL, IDENTITY, NS_SERIAL);
    return leave(put_str(serial, length, g->serial));
}

NVMLAPI nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    DEVICE_CALL(device, index != NULL, IDENTITY, 0);
    *index = (unsigned)(g - g_sc.gpus);
    return leave(NVML_SUCCESS);
}

NVMLAPI nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    DEVICE_CALL(device, minorNumber != NULL, IDENTITY, NS_MINOR_NUMBER);
    *minorNumber = g->minor;
    return leave(NVML_SUCCESS);
}

static void fill_pci(const struct gpu *g, nvmlPciInfo_t *pci)
{
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", g->domain & 0xFFFF, g->bus & 0xFF,
             g->device & 0xFF);
    copy_str(pci->busId, sizeof pci->busId, g->bus_id);
    pci->domain = g->domain;
    pci->bus = g->bus;
    pci->device = g->device;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_subsystem_id;
}

NVMLAPI nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    DEVICE_CALL(device, pci != NULL, IDENTITY, 0);
    fill_pci(g, pci);
    return leave(NVML_SUCCESS);
}

NVMLAPI nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

/* v1: the original 52-byte struct; never write past it. */
NVMLAPI nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_v1_t *pci)
{
    DEVICE_CALL(device, pci != NULL, IDENTITY, 0);
    nvmlPciInfo_t full;
    fill_pci(g, &full);
    memset(pci, 0, sizeof *pci);
    memcpy(pci->busId, full.busIdLegacy, sizeof pci->busId);
    pci->domain = full.domain;
    pci->bus = full.bus;
    pci->device = full.device;
    pci->pciDeviceId = full.pciDeviceId;
    pci->pciSubSystemId = full.pciSubSystemId;
    return leave(NVML_SUCCESS);
}

/* ---- memory ------------------------------------------------------------- */

/*
 * used_v2 = base_used + leaked + processes counted on the GPU;
 * free = total - reserved - used_v2 (never below 0);
 * v1 `used` includes the reserved memory.
 */
static void memory_mib(const struct gpu *g, const struct mig *m, long long *total, long long *reserved,
                       long long *used_v2, long long *free_)
{
    refresh_procs();
    long long procs = scan_gpu((unsigned)(g - g_sc.gpus), m, 0, NULL, NULL);
    *total = m ? m->mem_mib : g->total_mib;
    *reserved = m ? 0 : g->reserved_mib;
    *used_v2 = m ? procs : g->base_used_mib + g->leaked_mib + procs;
    *free_ = *total - *reserved - *used_v2;
    if (*free_ < 0)
        *free_ = 0;
}

#define MIB(x) ((unsigned long long)(x) * 1048576ULL)

NVMLAPI nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    MIG_CALL(device, memory != NULL, QUERY, NS_MEMORY | NS_MEMORY_V1);
    long long total, reserved, used, free_;
    memory_mib(g, m, &total, &reserved, &used, &free_);
    memory->total = MIB(total);
    memory->free = MIB(free_);
    memory->used = MIB(used + reserved);
    return leave(NVML_SUCCESS);
}

NVMLAPI nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    MIG_CALL(device, memory != NULL, QUERY, NS_MEMORY | NS_MEMORY_V2);
    if (memory->version != NVML_MEMORY_V2_VERSION)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    long long total, reserved, used, free_;
    memory_mib(g, m, &total, &reserved, &used, &free_);
    memory->total = MIB(total);
    memory->reserved = MIB(reserved);
    memory->free = MIB(free_);
    memory->used = MIB(used);
    return leave(NVML_SUCCESS);
}

/* ---- other dynamic queries ---------------------------------------------- */

NVMLAPI nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    DEVICE_CALL(device, utilization != NULL, QUERY, NS_UTILIZATION);
    if (g->mig_current) /* nvidia-smi prints utilization.gpu [N/A] in MIG mode (tests/field: exporter-linux-h100-mig) */
        return leave(NVML_ERROR_NOT_SUPPORTED);
    utilization->gpu = g->util_gpu;
    utilization->memory = g->util_mem;
    return leave(NVML_SUCCESS);
}

NVMLAPI nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, unsigned int sensorType, unsigned int *temp)
{
    DEVICE_CALL(device, temp != NULL && sensorType == NVML_TEMPERATURE_GPU, QUERY, NS_TEMPERATURE);
    *temp = (unsigned)g->temperature;
    return leave(NVML_SUCCESS);
}

NVMLAPI nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature)
{
    DEVICE_CALL(device, temperature != NULL, QUERY, NS_TEMPERATURE);
    if (temperature->version != NVML_TEMPERATURE_V1_VERSION)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (temperature->sensorType != NVML_TEMPERATURE_GPU)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    temperature->temperature = g->temperature;
    return leave(NVML_SUCCESS);
}

NVMLAPI nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    DEVICE_CALL(device, power != NULL, QUERY, NS_POWER);
    *power = g->power_mw;
    return leave(NVML_SUCCESS);
}

NVMLAPI nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    DEVICE_CALL(device, limit != NULL, QUERY, NS_POWER_LIMIT);
    *limit = g->power_limit_mw;
    return leave(NVML_SUCCESS);
}

NVMLAPI nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    DEVICE_CALL(device, limit != NULL, QUERY, NS_POWER_LIMIT);
    *limit = g->power_limit_mw;
    return leave(NVML_SUCCESS);
}

NVMLAPI nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed)
{
    DEVICE_CALL(device, speed != NULL, QUERY, NS_FAN);
    if (g->fan < 0) /* H200s have no fan */
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *speed = (unsigned)g->fan;
    return leave(NVML_SUCCESS);
}

/* No encoder/decoder load is simulated: 0 % over the usual 167 ms sampling period. */
NVMLAPI nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                    unsigned int *samplingPeriodUs)
{
    DEVICE_CALL(device, utilization != NULL && samplingPeriodUs != NULL, QUERY, NS_ENCODER);
    *utilization = 0;
    *samplingPeriodUs = 167000;
    return leave(NVML_SUCCESS);
}

NVMLAPI nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                                    unsigned int *samplingPeriodUs)
{
    DEVICE_CALL(device, utilization != NULL && samplingPeriodUs != NULL, QUERY, NS_DECODER);
    *utilization = 0;
    *samplingPeriodUs = 167000;
    return leave(NVML_SUCCESS);
}

NVMLAPI nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, unsigned int *mode)
{
    DEVICE_CALL(device, mode != NULL, QUERY, NS_PERSISTENCE);
    *mode = g->persistence;
    return leave(NVML_SUCCESS);
}

NVMLAPI nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, unsigned int *mode)
{
    DEVICE_CALL(device, mode != NULL, QUERY, NS_COMPUTE_MODE);
    *mode = g->compute_mode;
    return leave(NVML_SUCCESS);
}

NVMLAPI nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    DEVICE_CALL(device, currentMode != NULL && pendingMode != NULL, QUERY, NS_MIG_MODE);
    *currentMode = g->mig_current;
    *pendingMode = g->mig_pending;
    return leave(NVML_SUCCESS);
}

NVMLAPI nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    MIG_CALL(device, isMigDevice != NULL, IDENTITY, 0);
    (void)g;
    *isMigDevice = m != NULL;
    return leave(NVML_SUCCESS);
}

/* ---- MIG (README "MIG"): the MIG device handles of a GPU in MIG mode ------------------------------ */

/* nvml.h: "the maximum number of MIG devices that can exist under a given parent NVML device";
 * 0 when MIG is off (assumed), 7 on the simulated (A100/H100/H200-class) GPUs. */
NVMLAPI nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    DEVICE_CALL(device, count != NULL, QUERY, NS_MIG_MODE);
    *count = g->mig_current ? MAX_MIG : 0;
    return leave(NVML_SUCCESS);
}

/* index 0..max-1: NOT_FOUND where no MIG device is (go-nvlib and the k8s-device-plugin skip those);
 * INVALID_ARGUMENT past the maximum; NOT_SUPPORTED with MIG off (assumed). */
NVMLAPI nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                         nvmlDevice_t *migDevice)
{
    DEVICE_CALL(device, migDevice != NULL, QUERY, NS_MIG_MODE);
    if (!g->mig_current)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (index >= MAX_MIG)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if ((int)index >= g->nmig)
        return leave(NVML_ERROR_NOT_FOUND);
    *migDevice = &g_migdevs[g - g_sc.gpus][index];
    return leave(NVML_SUCCESS);
}

NVMLAPI nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device)
{
    MIG_CALL(migDevice, device != NULL, IDENTITY, 0);
    if (!m)
        return leave(NVML_ERROR_INVALID_ARGUMENT); /* not a MIG device handle (assumed) */
    *device = &g_devs[g - g_sc.gpus];
    return leave(NVML_SUCCESS);
}

NVMLAPI nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    MIG_CALL(device, id != NULL, IDENTITY, 0);
    (void)g;
    if (!m)
        return leave(NVML_ERROR_NOT_SUPPORTED); /* a GPU handle (nvml.h: "not supported" if not a MIG device) */
    *id = m->gi;
    return leave(NVML_SUCCESS);
}

NVMLAPI nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    MIG_CALL(device, id != NULL, IDENTITY, 0);
    (void)g;
    if (!m)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *id = m->ci;
    return leave(NVML_SUCCESS);
}

/* Derived from the name (the scenario has no field for it); Hopper by default. */
NVMLAPI nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    static const struct {
        const char *needle;
        int major, minor;
    } table[] = {
        {"GB10", 12, 1}, {"B200", 10, 0}, {"B100", 10, 0}, {"H100", 9, 0}, {"H200", 9, 0}, {"H800", 9, 0},
        {"H20", 9, 0},   {"A100", 8, 0},  {"A800", 8, 0},  {"A30", 8, 0},  {"L40", 8, 9},  {"L4", 8, 9},
        {"A40", 8, 6},   {"A10", 8, 6},   {"T4", 7, 5},    {"V100", 7, 0},
    };
    DEVICE_CALL(device, major != NULL && minor != NULL, QUERY, 0);
    *major = 9;
    *minor = 0;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strstr(g->name, table[i].needle)) {
            *major = table[i].major;
            *minor = table[i].minor;
            break;
        }
    return leave(NVML_SUCCESS);
}

NVMLAPI nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, int *type)
{
    DEVICE_CALL(device, type != NULL, QUERY, 0);
    (void)g;
    *type = NVML_BRAND_NVIDIA;
    return leave(NVML_SUCCESS);
}

/* ---- running processes: the two-call protocol --------------------------- */

/* The processes of <types> on the GPU that the caller sees (refresh_procs() first); malloc'd, may be NULL. */
static struct seen_proc *seen_processes(const struct gpu *g, const struct mig *m, unsigned types, size_t *n,
                                        int *oom)
{
    refresh_procs();
    struct seen_proc *seen = NULL;
    *n = 0;
    *oom = 0;
    if (g_nprocs) {
        seen = malloc(g_nprocs * sizeof *seen);
        if (!seen) {
            *oom = 1;
            return NULL;
        }
    }
    scan_gpu((unsigned)(g - g_sc.gpus), m, types, seen, n);
    return seen;
}

/* One entry in one of the three layouts (entry_size: 16, 24 or 32 bytes). */
static void put_process(void *infos, size_t i, size_t entry_size, const struct seen_proc *p)
{
    if (entry_size == sizeof(nvmlProcessInfo_v1_t)) {
        nvmlProcessInfo_v1_t *e = (nvmlProcessInfo_v1_t *)infos + i;
        memset(e, 0, sizeof *e);
        e->pid = p->pid;
        e->usedGpuMemory = p->used_bytes;
    } else if (entry_size == sizeof(nvmlProcessInfo_v3_t)) {
        nvmlProcessInfo_v3_t *e = (nvmlProcessInfo_v3_t *)infos + i;
        memset(e, 0, sizeof *e);
        e->pid = p->pid;
        e->usedGpuMemory = p->used_bytes;
        e->gpuInstanceId = p->gi; /* NVML_INVALID_INSTANCE_ID with MIG off */
        e->computeInstanceId = p->ci;
        e->usedGpuCcProtectedMemory = 0; /* CC off */
    } else {
        nvmlProcessInfo_t *e = (nvmlProcessInfo_t *)infos + i;
        memset(e, 0, sizeof *e);
        e->pid = p->pid;
        e->usedGpuMemory = p->used_bytes;
        e->gpuInstanceId = p->gi;
        e->computeInstanceId = p->ci;
    }
}

/*
 * nvml.h: "call this function with *infoCount = 0 [infos may be NULL]. The
 * return code will be NVML_ERROR_INSUFFICIENT_SIZE, or NVML_SUCCESS if none
 * are running."  Then:
 *   - *infoCount == 0 or infos == NULL: *infoCount = N; SUCCESS when N == 0,
 *     else INSUFFICIENT_SIZE;
 *   - *infoCount < N: *infoCount = N, INSUFFICIENT_SIZE (processes may have
 *     appeared between the two calls);
 *   - else: N entries written, *infoCount = N, SUCCESS.
 * `entry_size` selects the layout: nvmlProcessInfo_v1_t (legacy unversioned
 * symbols), nvmlProcessInfo_t (_v2), or 0 for the _v3 symbols: the scenario's
 * process_v3_entry_bytes (nvmlProcessInfo_t, or nvmlProcessInfo_v3_t as early
 * R535 libraries wrote).  The count is in entries of that layout.
 */
static nvmlReturn_t running_processes(nvmlDevice_t device, unsigned int *infoCount, void *infos, unsigned types,
                                      size_t entry_size)
{
    MIG_CALL(device, infoCount != NULL, QUERY, NS_PROCESSES);
    if (entry_size == 0)
        entry_size = g_sc.process_v3_entry_bytes;
    size_t n;
    int oom;
    struct seen_proc *seen = seen_processes(g, m, types, &n, &oom);
    if (oom)
        return leave(NVML_ERROR_UNKNOWN);
    if (*infoCount == 0 || infos == NULL || *infoCount < n) {
        *infoCount = (unsigned)n;
        ret = n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    } else {
        for (size_t i = 0; i < n; i++)
            put_process(infos, i, entry_size, &seen[i]);
        *infoCount = (unsigned)n;
        ret = NVML_SUCCESS;
    }
    free(seen);
    return leave(ret);
}

#define PROCESS_QUERIES(Kind, type)                                                                              \
    NVMLAPI nvmlReturn_t nvmlDeviceGet##Kind##RunningProcesses(nvmlDevice_t device, unsigned int *infoCount,    \
                                                               nvmlProcessInfo_v1_t *infos)                     \
    {                                                                                                            \
        return running_processes(device, infoCount, infos, type, sizeof(nvmlProcessInfo_v1_t));                  \
    }                                                                                                            \
    NVMLAPI nvmlReturn_t nvmlDeviceGet##Kind##RunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount, \
                                                                  nvmlProcessInfo_t *infos)                     \
    {                                                                                                            \
        return running_processes(device, infoCount, infos, type, sizeof(nvmlProcessInfo_t));                     \
    }                                                                                                            \
    NVMLAPI nvmlReturn_t nvmlDeviceGet##Kind##RunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount, \
                                                                  nvmlProcessInfo_t *infos)                     \
    {                                                                                                            \
        return running_processes(device, infoCount, infos, type, 0);                                             \
    }

PROCESS_QUERIES(Compute, T_COMPUTE)
PROCESS_QUERIES(Graphics, T_GRAPHICS)
PROCESS_QUERIES(MPSCompute, T_MPS)

/*
 * The versioned successor of the _v3 queries (nvml.h: "Get information about
 * running processes on a device for input context"): plist->mode picks the
 * kind, the same two-call protocol on plist->numProcArrayEntries with
 * plist->procArray (NULL allowed in the first call), 32-byte entries.  Own
 * checks after the common ones: .version (ARGUMENT_VERSION_MISMATCH), then
 * .mode (INVALID_ARGUMENT unless compute, graphics or MPS).
 */
NVMLAPI nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device, nvmlProcessDetailList_t *plist)
{
    MIG_CALL(device, plist != NULL, QUERY, NS_PROCESSES);
    if (plist->version != NVML_PROCESS_DETAIL_LIST_V1_VERSION)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    unsigned types = plist->mode == NVML_PROCESS_MODE_COMPUTE    ? T_COMPUTE
                     : plist->mode == NVML_PROCESS_MODE_GRAPHICS ? T_GRAPHICS
                     : plist->mode == NVML_PROCESS_MODE_MPS      ? T_MPS
                                                                 : 0;
    if (!types)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    size_t n;
    int oom;
    struct seen_proc *seen = seen_processes(g, m, types, &n, &oom);
    if (oom)
        return leave(NVML_ERROR_UNKNOWN);
    if (plist->numProcArrayEntries == 0 || plist->procArray == NULL || plist->numProcArrayEntries < n) {
        plist->numProcArrayEntries = (unsigned)n;
        ret = n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    } else {
        for (size_t i = 0; i < n; i++)
            put_process(plist->procArray, i, sizeof(nvmlProcessDetail_v1_t), &seen[i]);
        plist->numProcArrayEntries = (unsigned)n;
        ret = NVML_SUCCESS;
    }
    free(seen);
    return leave(ret);
}

/*
 * Confidential Computing is never on here: SUCCESS with both sizes 0.  (nvml.h
 * lists SUCCESS, UNINITIALIZED, INVALID_ARGUMENT and NOT_SUPPORTED "if this
 * query is not supported by the device"; it says nothing of CC off, so what a
 * CC-capable GPU with CC off answers is an assumption; `not_supported
 * conf_compute` gives the other answer.)
 */
NVMLAPI nvmlReturn_t nvmlDeviceGetConfComputeMemSizeInfo(nvmlDevice_t device, nvmlConfComputeMemSizeInfo_t *memInfo)
{
    DEVICE_CALL(device, memInfo != NULL, QUERY, NS_CONF_COMPUTE);
    (void)g;
    memInfo->protectedMemSizeKib = 0;
    memInfo->unprotectedMemSizeKib = 0;
    return leave(NVML_SUCCESS);
}

/* ---- health: row remapper, page retirement, ECC, fabric, clock event reasons ---------------- */

/*
 * What a GPU model supports, by its architecture (the compute capability its name gives, as in
 * nvmlDeviceGetCudaComputeCapability): pages are retired before Ampere and rows remapped from
 * Ampere on (NVIDIA's A100 memory error management docs: row remapping replaces page
 * retirement); a GB10's unified LPDDR5x reports no ECC ("Volatile Uncorr. ECC: N/A" in its
 * nvidia-smi tables) and, assumed, no row remapper.
 */
static int gpu_major(const struct gpu *g)
{
    static const struct {
        const char *needle;
        int major;
    } table[] = {{"GB10", 12}, {"B200", 10}, {"B100", 10}, {"H100", 9}, {"H200", 9}, {"H800", 9}, {"H20", 9},
                 {"A100", 8},  {"A800", 8},  {"A30", 8},   {"L40", 8},  {"L4", 8},   {"A40", 8},  {"A10", 8},
                 {"T4", 7},    {"V100", 7}};
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strstr(g->name, table[i].needle))
            return table[i].major;
    return 9;
}

static int is_gb10(const struct gpu *g) { return strstr(g->name, "GB10") != NULL; }

NVMLAPI nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                               unsigned int *isPending, unsigned int *failureOccurred)
{
    DEVICE_CALL(device, corrRows && uncRows && isPending && failureOccurred, QUERY, NS_REMAPPED_ROWS);
    if (gpu_major(g) < 8 || is_gb10(g))
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *corrRows = g->remap_corrected;
    *uncRows = g->remap_uncorrected;
    *isPending = g->remap_pending ? 1 : 0;
    *failureOccurred = g->remap_failure ? 1 : 0;
    return leave(NVML_SUCCESS);
}

NVMLAPI nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, unsigned int *isPending)
{
    DEVICE_CALL(device, isPending != NULL, QUERY, NS_RETIRED_PAGES);
    if (gpu_major(g) >= 8)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *isPending = g->retired_pending ? 1 : 0;
    return leave(NVML_SUCCESS);
}

/* nvml.h: "Reads the infoROM from the flash and verifies the checksums": NVML_ERROR_CORRUPTED_INFOROM when the
 * infoROM is corrupted (README "Health", infoROM). */
NVMLAPI nvmlReturn_t nvmlDeviceValidateInforom(nvmlDevice_t device)
{
    DEVICE_CALL(device, 1, QUERY, 0);
    return leave(g->inforom_corrupt ? NVML_ERROR_CORRUPTED_INFOROM : NVML_SUCCESS);
}

NVMLAPI nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
    DEVICE_CALL(device, current != NULL && pending != NULL, QUERY, NS_ECC);
    if (is_gb10(g))
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *current = *pending = g->ecc_mode ? 1 : 0;
    return leave(NVML_SUCCESS);
}

/* errorType: 0 corrected, 1 uncorrected; counterType: 0 volatile (since the driver loaded), 1 aggregate. */
NVMLAPI nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, unsigned int errorType, unsigned int counterType,
                                                 unsigned long long *eccCounts)
{
    DEVICE_CALL(device, eccCounts != NULL && errorType <= 1 && counterType <= 1, QUERY, NS_ECC);
    if (is_gb10(g) || !g->ecc_mode)
        return leave(NVML_ERROR_NOT_SUPPORTED); /* nvml.h: needs ECC mode on */
    *eccCounts = errorType ? g->ecc_volatile_uncorrected : g->ecc_volatile_corrected;
    return leave(NVML_SUCCESS);
}

static void fill_fabric(const struct gpu *g, unsigned char *uuid, nvmlReturn_t *status, unsigned int *clique,
                        unsigned char *state)
{
    memset(uuid, 0, NVML_GPU_FABRIC_UUID_LEN);
    *state = (unsigned char)(g->fabric_state < 0 ? 0 : g->fabric_state);
    *clique = 0;
    *status = NVML_SUCCESS;
    if (*state == 3) { /* nvml.h: status "must be checked only if state returns complete" */
        uint32_t h = fnv1a(g_dir, 2166136261u);
        memcpy(uuid, &h, sizeof h);
        *clique = 1;
        *status = g->fabric_status;
    }
}

NVMLAPI nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *info)
{
    DEVICE_CALL(device, info != NULL, QUERY, NS_FABRIC);
    memset(info, 0, sizeof *info);
    fill_fabric(g, info->clusterUuid, &info->status, &info->cliqueId, &info->state);
    return leave(NVML_SUCCESS);
}

NVMLAPI nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *info)
{
    DEVICE_CALL(device, info != NULL, QUERY, NS_FABRIC);
    unsigned version = info->version;
    if (version != NVML_GPU_FABRIC_INFO_V2_VERSION && version != NVML_GPU_FABRIC_INFO_V3_VERSION)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    size_t n = version == NVML_GPU_FABRIC_INFO_V2_VERSION ? offsetof(nvmlGpuFabricInfoV_t, healthSummary)
                                                           : sizeof(nvmlGpuFabricInfoV_t);
    memset(info, 0, n); /* never past the caller's (v2: 36-byte) struct */
    info->version = version;
    fill_fabric(g, info->clusterUuid, &info->status, &info->cliqueId, &info->state);
    return leave(NVML_SUCCESS);
}

NVMLAPI nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    DEVICE_CALL(device, reasons != NULL, QUERY, NS_CLOCK_REASONS);
    *reasons = g->clock_reasons;
    return leave(NVML_SUCCESS);
}

/* The name before R535 (nvml.h keeps it, deprecated): the same bits. */
NVMLAPI nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    DEVICE_CALL(device, reasons != NULL, QUERY, NS_CLOCK_REASONS);
    *reasons = g->clock_reasons;
    return leave(NVML_SUCCESS);
}
