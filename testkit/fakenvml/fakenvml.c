/*
 * fakenvml: a stand-in for libnvidia-ml.so.1 so that trainmon's real pynvml
 * code path (ctypes structs, return codes, versioned symbols) runs without a GPU.
 *
 * Struct layouts follow nvml.h as mirrored by pynvml's ctypes definitions.
 * Behaviour comes from the scenario file named by $FAKENVML_SCENARIO, read at
 * nvmlInit when that variable changed; without it nvmlInit answers
 * NVML_ERROR_DRIVER_NOT_LOADED (a machine with the library but no driver).
 * The scenario format is documented in README.md beside this file.
 *
 * Time t is seconds since the library was loaded, or the value last given to
 * fakenvml_set_time() (tests that need determinism).
 *
 * Build with -DFAKENVML_OLD_DRIVER to leave out the symbols an old driver
 * lacks (field values, energy, event wait v2, process list v3, GPM, row
 * remapping, versioned fabric info, the GPU's own max PCIe generation).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_GPUS 64
#define MAX_RULES 128
#define SAMPLE_BUFFER 100
#define NVLINKS 18        /* default NVLink links per GPU (H100 SXM) */
#define NVML_MAX_LINKS 36 /* NVML_NVLINK_MAX_LINKS as pynvml 13 declares it */
#define MAX_MIG 7         /* MIG devices per GPU (nvmlDeviceGetMaxMigDeviceCount on an H100) */
#define NO_INSTANCE 0xFFFFFFFFu /* gpuInstanceId / computeInstanceId outside MIG */

enum {
    OK = 0, UNINITIALIZED = 1, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3,
    NOT_FOUND = 6, INSUFFICIENT_SIZE = 7, DRIVER_NOT_LOADED = 9, TIMEOUT = 10,
    MEMORY = 20, GPU_IS_LOST = 15, ARGUMENT_VERSION_MISMATCH = 25, UNKNOWN = 999
};

/* A GPU (mig = -1) or one of its MIG devices (mig = slot in sc.instances[index]). */
typedef struct nvmlDevice_st { unsigned int index; int mig; } *nvmlDevice_t;
typedef struct nvmlEventSet_st *nvmlEventSet_t;
typedef union { double dVal; unsigned int uiVal; unsigned long ulVal;
                unsigned long long ullVal; long long sllVal; int siVal;
                unsigned short usVal; } nvmlValue_t;
typedef struct { unsigned long long timeStamp; nvmlValue_t sampleValue; } nvmlSample_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { char busIdLegacy[16]; unsigned int domain, bus, device, pciDeviceId,
                 pciSubSystemId; char busId[32]; } nvmlPciInfo_t;
typedef struct { unsigned long long referenceTime, violationTime; } nvmlViolationTime_t;
typedef struct { unsigned int fieldId, scopeId; long long timestamp, latencyUsec;
                 unsigned int valueType; int nvmlReturn; nvmlValue_t value; } nvmlFieldValue_t;
typedef struct { nvmlDevice_t device; unsigned long long eventType, eventData;
                 unsigned int gpuInstanceId, computeInstanceId; } nvmlEventData_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory;
                 unsigned int gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;

enum pattern { STEADY, SQUARE, SAW };
typedef struct { enum pattern kind; double a, b, c, d; } util_t; /* see util_at() */
typedef struct { int gpu; double at; unsigned long long code; } xid_t;
typedef struct { int gpu; char name[64]; } unsupported_t;       /* gpu -1 = every GPU */
typedef struct { int gpu; unsigned int pid; unsigned long long bytes; int gi; } process_t; /* gi -1: no MIG */
typedef struct { double sm, occupancy, tensor, dram; } gpm_t;   /* percent, see gpm_value() */
/* A GPU instance (with one compute instance, id 0) of a GPU in MIG mode. */
typedef struct { unsigned int id; char profile[32]; unsigned long long used, total; gpm_t gpm;
                 double gone_at; } instance_t;   /* gone_at -1: never destroyed */
typedef struct { int gpu; unsigned int metric; } gpm_metric_rule_t;
/* Health readings of one GPU (see README.md, "Health"). */
typedef struct { unsigned int width, gen, max_width, max_gen, replays;
                 unsigned int remap_corr, remap_unc, remap_pending, remap_failed;
                 unsigned int retired_sbe, retired_dbe, retired_pending;
                 unsigned int links; unsigned long long links_down;   /* bit k = link k down */
                 int fabric; unsigned int fabric_state; int fabric_status; /* fabric: 0 = none */
                 unsigned int recovery_action, max_clock_mhz; } health_t;

static struct {
    char path[4096];
    int count, sparse_idle[MAX_GPUS], no_samples[MAX_GPUS], no_aggregate[MAX_GPUS];
    double lost_at[MAX_GPUS], found_at[MAX_GPUS], unloaded_from, unloaded_to, sample_period;
    char name[96], driver[80];
    util_t util[MAX_GPUS];
    xid_t xids[MAX_RULES]; int nxids;
    unsupported_t unsupported[MAX_RULES]; int nunsupported;
    unsupported_t unsupported_fields[MAX_RULES]; int nunsupported_fields;
    unsupported_t failing[MAX_RULES]; int nfailing;
    process_t processes[MAX_RULES]; int nprocesses;
    gpm_t gpm[MAX_GPUS]; int gpm_named[MAX_GPUS]; int gpm_unsupported[MAX_GPUS]; unsigned int gpm_version;
    gpm_metric_rule_t gpm_missing[MAX_RULES]; int ngpm_missing;
    health_t health[MAX_GPUS];
    int mig[MAX_GPUS], ninstances[MAX_GPUS];
    instance_t instances[MAX_GPUS][MAX_MIG];
} sc;

struct nvmlEventSet_st { unsigned long long mask[MAX_GPUS]; double since[MAX_GPUS];
                         unsigned char delivered[MAX_RULES]; };

static struct nvmlDevice_st devices[MAX_GPUS], mig_devices[MAX_GPUS][MAX_MIG];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int refcount;
static double session_start, origin, manual_time = -1;
static unsigned long long origin_epoch_us, calls;

static double monotonic(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((constructor)) static void loaded(void) {
    struct timespec ts; clock_gettime(CLOCK_REALTIME, &ts);
    origin = monotonic();
    origin_epoch_us = ts.tv_sec * 1000000ULL + ts.tv_nsec / 1000;
    for (int i = 0; i < MAX_GPUS; i++) {
        devices[i] = (struct nvmlDevice_st){(unsigned int)i, -1};
        for (int k = 0; k < MAX_MIG; k++) mig_devices[i][k] = (struct nvmlDevice_st){(unsigned int)i, k};
    }
}

static double now(void) {
    double manual;
    __atomic_load(&manual_time, &manual, __ATOMIC_RELAXED);
    return manual >= 0 ? manual : monotonic() - origin;
}

/* -- test controls (not NVML) ---------------------------------------------- */
EXPORT void fakenvml_set_time(double seconds) { __atomic_store(&manual_time, &seconds, __ATOMIC_RELAXED); }
EXPORT unsigned long long fakenvml_calls(void) { return __atomic_load_n(&calls, __ATOMIC_RELAXED); }

/* -- scenario ---------------------------------------------------------------- */
static int gpu_arg(const char *word) { return strcmp(word, "*") == 0 ? -1 : atoi(word); }

static void set_util(const char *target, util_t util) {
    int gpu = gpu_arg(target);
    for (int i = 0; i < MAX_GPUS; i++) if (gpu < 0 || gpu == i) sc.util[i] = util;
}

static void set_flag(int *flags, const char *target) {
    int gpu = gpu_arg(target);
    for (int i = 0; i < MAX_GPUS; i++) if (gpu < 0 || gpu == i) flags[i] = 1;
}

static void set_gpm(const char *target, gpm_t gpm) {
    int gpu = gpu_arg(target);
    for (int i = 0; i < MAX_GPUS; i++) if (gpu < 0 || gpu == i) { sc.gpm[i] = gpm; sc.gpm_named[i] = 1; }
}

/* Apply `edit` to the health of every GPU `target` names. */
#define SET_HEALTH(target, edit) do { int g_ = gpu_arg(target); \
    for (int i_ = 0; i_ < MAX_GPUS; i_++) if (g_ < 0 || g_ == i_) { health_t *h = &sc.health[i_]; edit; } } while (0)

/* `nvlink GPU LINKS [DOWN,DOWN...]`: LINKS links, those listed down. */
static void set_nvlink(const char *line) {
    char target[16], down[256] = ""; unsigned int links;
    if (sscanf(line, "nvlink %15s %u %255s", target, &links, down) < 2) return;
    if (links > NVML_MAX_LINKS) links = NVML_MAX_LINKS;
    unsigned long long mask = 0;
    for (char *word = strtok(down, ","); word; word = strtok(NULL, ",")) {
        int link = atoi(word);
        if (link >= 0 && link < (int)links) mask |= 1ULL << link;
    }
    SET_HEALTH(target, (h->links = links, h->links_down = mask));
}

/* The slot of GPU instance `id` of GPU `gpu` in sc.instances, -1 if none. */
static int find_instance(int gpu, unsigned int id) {
    for (int k = 0; k < sc.ninstances[gpu]; k++) if (sc.instances[gpu][k].id == id) return k;
    return -1;
}
static double now(void);
/* Whether the instance in slot k of GPU gpu exists at the fake time (`mig_destroyed`). */
static int instance_live(int gpu, int k) { double gone = sc.instances[gpu][k].gone_at; return gone < 0 || now() < gone; }
/* The slot of live GPU instance `id` of GPU `gpu`, -1 if none. */
__attribute__((unused)) static int instance_slot(int gpu, unsigned int id) {
    int k = find_instance(gpu, id);
    return k >= 0 && instance_live(gpu, k) ? k : -1;
}

/* `mig_instance GPU ID PROFILE USED_MIB TOTAL_MIB`: add (or redefine) a GPU instance. */
static void add_instance(const char *line) {
    int gpu; unsigned int id; char profile[32]; unsigned long long used, total;
    if (sscanf(line, "mig_instance %d %u %31s %llu %llu", &gpu, &id, profile, &used, &total) != 5
        || gpu < 0 || gpu >= MAX_GPUS) return;
    int slot = find_instance(gpu, id);
    if (slot < 0) { if (sc.ninstances[gpu] >= MAX_MIG) return; slot = sc.ninstances[gpu]++; }
    sc.instances[gpu][slot].gone_at = -1;
    instance_t *in = &sc.instances[gpu][slot];
    in->id = id; snprintf(in->profile, sizeof in->profile, "%s", profile);
    in->used = used << 20; in->total = total << 20;
}

/* GPM exists on a GPU that a `gpm` line names and no `gpm_unsupported` line takes away:
 * a scenario without GPM lines is a pre-Hopper node. */
__attribute__((unused)) static int gpm_supported(unsigned int i) { return sc.gpm_named[i] && !sc.gpm_unsupported[i]; }

static int load_scenario(const char *path) {
    FILE *file = fopen(path, "r");
    if (!file) { fprintf(stderr, "fakenvml: cannot open scenario %s\n", path); return UNKNOWN; }
    memset(&sc, 0, sizeof sc);
    snprintf(sc.path, sizeof sc.path, "%s", path);
    sc.count = 1; sc.sample_period = 1.0 / 6; sc.unloaded_from = sc.unloaded_to = -1;
    strcpy(sc.name, "NVIDIA H100 80GB HBM3"); strcpy(sc.driver, "550.54.15");
    for (int i = 0; i < MAX_GPUS; i++) { sc.lost_at[i] = -1; sc.found_at[i] = -1; sc.util[i] = (util_t){STEADY, 0, 0, 0, 0}; }
    sc.gpm_version = 1;
    for (int i = 0; i < MAX_GPUS; i++)   /* a healthy H100 SXM: x16 Gen5, 18 NVLinks up */
        sc.health[i] = (health_t){.width = 16, .gen = 5, .max_width = 16, .max_gen = 5,
                                  .links = NVLINKS, .max_clock_mhz = 1980};
    char line[512], word[64], target[16], text[96];
    double a, b, c, d; unsigned long long code; int n, k; unsigned int metric, u[4]; int status;
    while (fgets(line, sizeof line, file)) {
        char *hash = strchr(line, '#'); if (hash) *hash = 0;
        if (sscanf(line, "%63s", word) != 1) continue;
        if (!strcmp(word, "gpus")) sscanf(line, "%*s %d", &sc.count);
        else if (!strcmp(word, "name")) { if (sscanf(line, "%*s %95[^\n]", text) == 1) strcpy(sc.name, text); }
        else if (!strcmp(word, "driver")) sscanf(line, "%*s %79s", sc.driver);
        else if (!strcmp(word, "sample_period")) sscanf(line, "%*s %lf", &sc.sample_period);
        else if (sscanf(line, "steady %15s %lf %lf", target, &a, &b) == 3) set_util(target, (util_t){STEADY, a, b, 0, 0});
        else if (sscanf(line, "square %15s %lf %lf %lf %lf", target, &a, &b, &c, &d) == 5) set_util(target, (util_t){SQUARE, a, b, c, d});
        else if (sscanf(line, "saw %15s %lf %lf %lf %lf", target, &a, &b, &c, &d) == 5) set_util(target, (util_t){SAW, a, b, c, d});
        else if ((k = sscanf(line, "lost %d %lf %lf", &n, &a, &b)) >= 2 && n >= 0 && n < MAX_GPUS) {
            sc.lost_at[n] = a; sc.found_at[n] = k == 3 ? b : -1;
        } else if (sscanf(line, "gpm_unsupported %15s", target) == 1) set_flag(sc.gpm_unsupported, target);
        else if (sscanf(line, "gpm_metric_unsupported %15s %u", target, &metric) == 2 && sc.ngpm_missing < MAX_RULES)
            sc.gpm_missing[sc.ngpm_missing++] = (gpm_metric_rule_t){gpu_arg(target), metric};
        else if (sscanf(line, "gpm_version %u", &metric) == 1) sc.gpm_version = metric;
        else if (sscanf(line, "gpm %15s %lf %lf %lf %lf", target, &a, &b, &c, &d) == 5) set_gpm(target, (gpm_t){a, b, c, d});
        else if (sscanf(line, "mig %15s", target) == 1 && !strcmp(word, "mig")) set_flag(sc.mig, target);
        else if (!strcmp(word, "mig_instance")) add_instance(line);
        else if (sscanf(line, "mig_gpm %d %u %lf %lf %lf %lf", &n, &metric, &a, &b, &c, &d) == 6 && n >= 0 && n < MAX_GPUS) {
            if ((k = find_instance(n, metric)) >= 0) sc.instances[n][k].gpm = (gpm_t){a, b, c, d};
        } else if (sscanf(line, "mig_destroyed %d %u %lf", &n, &metric, &a) == 3 && n >= 0 && n < MAX_GPUS) {
            if ((k = find_instance(n, metric)) >= 0) sc.instances[n][k].gone_at = a;
        } else if (sscanf(line, "mig_process %d %u %u %llu", &n, &metric, &u[0], &code) == 4 && sc.nprocesses < MAX_RULES)
            sc.processes[sc.nprocesses++] = (process_t){n, u[0], code, (int)metric};
        else if (sscanf(line, "xid %d %lf %llu", &n, &a, &code) == 3 && sc.nxids < MAX_RULES)
            sc.xids[sc.nxids++] = (xid_t){n, a, code};
        else if (sscanf(line, "unsupported_field %15s %63s", target, text) == 2 && sc.nunsupported_fields < MAX_RULES) {
            sc.unsupported_fields[sc.nunsupported_fields].gpu = gpu_arg(target);
            snprintf(sc.unsupported_fields[sc.nunsupported_fields++].name, 64, "%.63s", text);
        } else if (sscanf(line, "unsupported %15s %63s", target, text) == 2 && sc.nunsupported < MAX_RULES) {
            sc.unsupported[sc.nunsupported].gpu = gpu_arg(target);
            snprintf(sc.unsupported[sc.nunsupported++].name, 64, "%.63s", text);
        } else if (sscanf(line, "failing %15s %63s", target, text) == 2 && sc.nfailing < MAX_RULES) {
            sc.failing[sc.nfailing].gpu = gpu_arg(target);
            snprintf(sc.failing[sc.nfailing++].name, 64, "%.63s", text);
        } else if (sscanf(line, "process %d %u %llu", &n, &sc.processes[sc.nprocesses].pid, &code) == 3 && sc.nprocesses < MAX_RULES) {
            sc.processes[sc.nprocesses].gpu = n; sc.processes[sc.nprocesses].gi = -1;
            sc.processes[sc.nprocesses++].bytes = code;
        } else if (sscanf(line, "sparse_idle %15s", target) == 1) set_flag(sc.sparse_idle, target);
        else if (sscanf(line, "no_samples %15s", target) == 1) set_flag(sc.no_samples, target);
        else if (sscanf(line, "no_nvlink_aggregate %15s", target) == 1) set_flag(sc.no_aggregate, target);
        else if (sscanf(line, "driver_unloaded %lf %lf", &a, &b) == 2) { sc.unloaded_from = a; sc.unloaded_to = b; }
        else if (sscanf(line, "pcie_link %15s %u %u %u %u", target, &u[0], &u[1], &u[2], &u[3]) == 5)
            SET_HEALTH(target, (h->width = u[0], h->gen = u[1], h->max_width = u[2], h->max_gen = u[3]));
        else if (sscanf(line, "pcie_replays %15s %u", target, &u[0]) == 2) SET_HEALTH(target, h->replays = u[0]);
        else if (sscanf(line, "remapped_rows %15s %u %u %u %u", target, &u[0], &u[1], &u[2], &u[3]) == 5)
            SET_HEALTH(target, (h->remap_corr = u[0], h->remap_unc = u[1], h->remap_pending = u[2], h->remap_failed = u[3]));
        else if (sscanf(line, "retired_pages %15s %u %u %u", target, &u[0], &u[1], &u[2]) == 4)
            SET_HEALTH(target, (h->retired_sbe = u[0], h->retired_dbe = u[1], h->retired_pending = u[2]));
        else if (!strcmp(word, "nvlink")) set_nvlink(line);
        else if (sscanf(line, "fabric %15s %u %d", target, &u[0], &status) == 3)
            SET_HEALTH(target, (h->fabric = 1, h->fabric_state = u[0], h->fabric_status = status));
        else if (sscanf(line, "recovery_action %15s %u", target, &u[0]) == 2) SET_HEALTH(target, h->recovery_action = u[0]);
        else if (sscanf(line, "max_clock %15s %u", target, &u[0]) == 2) SET_HEALTH(target, h->max_clock_mhz = u[0]);
        else fprintf(stderr, "fakenvml: ignoring scenario line: %s", line);
    }
    fclose(file);
    if (sc.count < 0 || sc.count > MAX_GPUS) sc.count = MAX_GPUS;
    return OK;
}

/* Utilization percent at time t.  steady LEVEL NOISE: LEVEL ± NOISE (a fixed
 * pseudo-random sequence); square PERIOD DUTY BUSY IDLE: BUSY for the first
 * DUTY share of each period, else IDLE; saw PERIOD DUTY BUSY IDLE: a ramp from
 * IDLE up to BUSY over the first DUTY share, then IDLE. */
static unsigned int util_at(int gpu, double t) {
    util_t u = sc.util[gpu];
    double value = u.a;
    if (u.kind == STEADY) {
        unsigned long long k = (unsigned long long)(t / sc.sample_period) * 2654435761ULL + gpu * 97;
        value = u.a + u.b * (((k >> 7) % 2001) / 1000.0 - 1.0);
    } else {
        double phase = fmod(t, u.a) / u.a;
        if (phase >= u.b) value = u.d;
        else value = u.kind == SQUARE ? u.c : u.d + (u.c - u.d) * phase / u.b;
    }
    return value < 0 ? 0 : value > 100 ? 100 : (unsigned int)lround(value);
}

static int named(const unsupported_t *rules, int n, int gpu, const char *name) {
    for (int i = 0; i < n; i++)
        if ((rules[i].gpu < 0 || rules[i].gpu == gpu) && !strcmp(rules[i].name, name)) return 1;
    return 0;
}

static int unloaded(double t) { return sc.unloaded_from >= 0 && t >= sc.unloaded_from && t < sc.unloaded_to; }

/* The state a call meets: session, driver, device, lost, unsupported, failing. */
static int is_mig_handle(nvmlDevice_t dev) {
    return dev >= &mig_devices[0][0] && dev < &mig_devices[0][0] + MAX_GPUS * MAX_MIG;
}

/* A MIG handle is valid while its GPU is in MIG mode and has that instance. */
static int check(nvmlDevice_t dev, const char *function) {
    double t = now();
    if (refcount <= 0) return UNINITIALIZED;
    if (unloaded(t)) return DRIVER_NOT_LOADED;
    if (sc.unloaded_from >= 0 && session_start < sc.unloaded_from && t >= sc.unloaded_to) return UNINITIALIZED;
    if (dev == NULL) return OK;
    if (is_mig_handle(dev)) {
        if ((int)dev->index >= sc.count || !sc.mig[dev->index] || dev->mig >= sc.ninstances[dev->index]
            || !instance_live(dev->index, dev->mig))
            return INVALID_ARGUMENT;
    } else if (dev < devices || dev >= devices + sc.count) return INVALID_ARGUMENT;
    if (sc.lost_at[dev->index] >= 0 && t >= sc.lost_at[dev->index]
        && (sc.found_at[dev->index] < 0 || t < sc.found_at[dev->index])) return GPU_IS_LOST;
    if (named(sc.unsupported, sc.nunsupported, dev->index, function)) return NOT_SUPPORTED;
    if (named(sc.failing, sc.nfailing, dev->index, function)) return UNKNOWN;
    return OK;
}

/* Every exported call starts here (and is counted once). */
static int enter(nvmlDevice_t dev, const char *function) {
    __atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED);
    return check(dev, function);
}
/* ENTER: a call on a GPU handle (a MIG handle is refused, INVALID_ARGUMENT);
 * ENTER_ANY: a call that also takes MIG handles. */
#define ENTER_ANY(dev) do { int rc_ = enter(dev, __func__); if (rc_) return rc_; } while (0)
#define ENTER(dev) do { if (dev && is_mig_handle(dev)) { enter(NULL, __func__); return INVALID_ARGUMENT; } \
                        ENTER_ANY(dev); } while (0)
#define INSTANCE(dev) (&sc.instances[(dev)->index][(dev)->mig])

/* -- init, system ------------------------------------------------------------- */
EXPORT int nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    __atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&lock);
    const char *path = getenv("FAKENVML_SCENARIO");
    int rc = OK;
    if (!path || !*path) rc = DRIVER_NOT_LOADED;
    else if (strcmp(path, sc.path) != 0) rc = load_scenario(path);
    if (rc == OK && unloaded(now())) rc = DRIVER_NOT_LOADED;
    if (rc == OK) { if (refcount++ == 0) session_start = now(); }
    pthread_mutex_unlock(&lock);
    return rc;
}
EXPORT int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT int nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT int nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    int rc = refcount > 0 ? (refcount--, OK) : UNINITIALIZED;
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT const char *nvmlErrorString(int result) {
    switch (result) {
    case OK: return "Success";
    case UNINITIALIZED: return "Uninitialized";
    case NOT_SUPPORTED: return "Not Supported";
    case DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

EXPORT int nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    ENTER(NULL);
    snprintf(version, length, "%s", sc.driver);
    return OK;
}

EXPORT int nvmlDeviceGetCount_v2(unsigned int *count) { ENTER(NULL); *count = sc.count; return OK; }

EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    int rc = enter(NULL, __func__);
    if (rc) return rc;
    if ((int)index >= sc.count) return INVALID_ARGUMENT;
    if ((rc = check(&devices[index], __func__))) return rc;
    *device = &devices[index];
    return OK;
}

/* -- identity ----------------------------------------------------------------- */
/* A MIG device is named after its GPU and profile, as drivers do ("… MIG 1g.10gb"). */
EXPORT int nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned int length) {
    ENTER_ANY(dev);
    if (is_mig_handle(dev)) snprintf(name, length, "%s MIG %s", sc.name, INSTANCE(dev)->profile);
    else snprintf(name, length, "%s", sc.name);
    return OK;
}

EXPORT int nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int length) {
    ENTER_ANY(dev);
    if (is_mig_handle(dev))
        snprintf(uuid, length, "MIG-%08x-fake-4000-8000-%012x", dev->index, (dev->index << 16) | INSTANCE(dev)->id);
    else snprintf(uuid, length, "GPU-%08x-fake-4000-8000-%012x", dev->index, dev->index);
    return OK;
}

EXPORT int nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t *pci) {
    ENTER(dev);
    memset(pci, 0, sizeof *pci);
    pci->bus = 0x18 + dev->index; pci->pciDeviceId = 0x233010de;
    snprintf(pci->busId, sizeof pci->busId, "00000000:%02X:00.0", pci->bus);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02X:00.0", pci->bus);
    return OK;
}

/* -- readings: fixed formulas of the index i and time t (see README.md) -------- */
static unsigned int power_mw(unsigned int i) { return 250000 + 1000 * i; }

EXPORT int nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *memory) {
    ENTER_ANY(dev);
    if (is_mig_handle(dev)) { memory->total = INSTANCE(dev)->total; memory->used = INSTANCE(dev)->used; }
    else { memory->total = 80ULL << 30; memory->used = (dev->index + 1ULL) << 30; }
    memory->free = memory->total - memory->used;
    return OK;
}

EXPORT int nvmlDeviceGetPowerUsage(nvmlDevice_t dev, unsigned int *mw) { ENTER(dev); *mw = power_mw(dev->index); return OK; }
EXPORT int nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t dev, unsigned int *mw) { ENTER(dev); *mw = 700000; return OK; }
EXPORT int nvmlDeviceGetTemperature(nvmlDevice_t dev, int sensor, unsigned int *c) {
    ENTER(dev); if (sensor != 0) return INVALID_ARGUMENT; *c = 40 + dev->index; return OK;
}
EXPORT int nvmlDeviceGetClockInfo(nvmlDevice_t dev, int type, unsigned int *mhz) {
    ENTER(dev); *mhz = type == 1 ? 1980 : 1000; return OK;
}

#ifndef FAKENVML_OLD_DRIVER
EXPORT int nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t dev, unsigned long long *mj) {
    ENTER(dev);
    *mj = 1000000ULL * (dev->index + 1) + (unsigned long long)(now() * power_mw(dev->index));
    return OK;
}
#endif

EXPORT int nvmlDeviceGetViolationStatus(nvmlDevice_t dev, int policy, nvmlViolationTime_t *v) {
    ENTER(dev);
    if (policy < 0 || policy > 11) return INVALID_ARGUMENT;
    v->referenceTime = origin_epoch_us;
    v->violationTime = 1000000000ULL * (dev->index + 1) * (policy + 1);
    return OK;
}

EXPORT int nvmlDeviceGetTotalEccErrors(nvmlDevice_t dev, int error_type, int counter_type, unsigned long long *count) {
    ENTER(dev);
    *count = (error_type == 0 ? 10ULL * dev->index : dev->index) + (counter_type == 1 ? 1000 : 0);
    return OK;
}

#ifndef FAKENVML_OLD_DRIVER
/* PCIe counters in bytes; NVLink data counters in KiB per link, scopeId = link
 * or UINT_MAX for the sum over all links. */
EXPORT int nvmlDeviceGetFieldValues(nvmlDevice_t dev, int count, nvmlFieldValue_t *values) {
    ENTER(dev);
    unsigned int i = dev->index;
    for (int k = 0; k < count; k++) {
        nvmlFieldValue_t *f = &values[k];
        char id[16]; snprintf(id, sizeof id, "%u", f->fieldId);
        unsigned int nvlinks = sc.health[i].links;
        int all = f->scopeId == 0xFFFFFFFFu, links = all ? (int)nvlinks : 1;
        f->timestamp = (long long)(origin_epoch_us + now() * 1e6); f->latencyUsec = 0;
        f->valueType = 3; f->nvmlReturn = OK; f->value.ullVal = 0;
        if (named(sc.unsupported_fields, sc.nunsupported_fields, i, id)) { f->nvmlReturn = NOT_SUPPORTED; continue; }
        switch (f->fieldId) {
        case 91: f->valueType = 1; f->value.uiVal = nvlinks; break;                  /* link count */
        case 230: f->valueType = 1; f->value.uiVal = sc.health[i].recovery_action; break; /* recovery action */
        case 197: f->value.ullVal = 1000000000ULL * (i + 1); break;                  /* PCIe TX */
        case 198: f->value.ullVal = 2000000000ULL * (i + 1); break;                  /* PCIe RX */
        case 138: case 139:                                                          /* NVLink TX, RX */
            if (!nvlinks) { f->nvmlReturn = NOT_SUPPORTED; break; }
            if ((all && sc.no_aggregate[i]) || (!all && f->scopeId >= nvlinks)) { f->nvmlReturn = INVALID_ARGUMENT; break; }
            f->value.ullVal = (f->fieldId == 138 ? 1000ULL : 2000ULL) * (i + 1) * links;
            break;
        default: f->nvmlReturn = NOT_SUPPORTED;
        }
    }
    return OK;
}
#endif

/* Like the real call, a byte count over a 20 ms interval: it blocks for 20 ms
 * (KiB/s; trainmon never calls it, the benchmark's baseline exporter does). */
EXPORT int nvmlDeviceGetPcieThroughput(nvmlDevice_t dev, int counter, unsigned int *kib_per_second) {
    ENTER(dev);
    struct timespec pause = {0, 20000000};
    nanosleep(&pause, NULL);
    *kib_per_second = (counter == 0 ? 1000 : 2000) * (dev->index + 1);
    return OK;
}

/* -- health: PCIe link, replays, memory repair, NVLink, fabric (README.md, "Health") -- */
#define HEALTH(dev) (&sc.health[(dev)->index])
EXPORT int nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t dev, unsigned int *v) { ENTER(dev); *v = HEALTH(dev)->width; return OK; }
EXPORT int nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t dev, unsigned int *v) { ENTER(dev); *v = HEALTH(dev)->max_width; return OK; }
EXPORT int nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t dev, unsigned int *v) { ENTER(dev); *v = HEALTH(dev)->gen; return OK; }
EXPORT int nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t dev, unsigned int *v) { ENTER(dev); *v = HEALTH(dev)->max_gen; return OK; }
#ifndef FAKENVML_OLD_DRIVER
EXPORT int nvmlDeviceGetGpuMaxPcieLinkGeneration(nvmlDevice_t dev, unsigned int *v) { ENTER(dev); *v = HEALTH(dev)->max_gen; return OK; }
#endif
EXPORT int nvmlDeviceGetPcieReplayCounter(nvmlDevice_t dev, unsigned int *v) { ENTER(dev); *v = HEALTH(dev)->replays; return OK; }
EXPORT int nvmlDeviceGetMaxClockInfo(nvmlDevice_t dev, int type, unsigned int *mhz) {
    ENTER(dev); *mhz = type == 1 ? HEALTH(dev)->max_clock_mhz : 2619; return OK;
}

#ifndef FAKENVML_OLD_DRIVER
EXPORT int nvmlDeviceGetRemappedRows(nvmlDevice_t dev, unsigned int *corr, unsigned int *unc,
                                     unsigned int *pending, unsigned int *failure) {
    ENTER(dev);
    health_t *h = HEALTH(dev);
    *corr = h->remap_corr; *unc = h->remap_unc; *pending = h->remap_pending; *failure = h->remap_failed;
    return OK;
}
#endif

/* nvmlPageRetirementCause_t: 0 = multiple single-bit, 1 = double-bit. A NULL
 * array (or one too small) answers the count with INSUFFICIENT_SIZE, as NVML. */
EXPORT int nvmlDeviceGetRetiredPages(nvmlDevice_t dev, int cause, unsigned int *count, unsigned long long *addresses) {
    ENTER(dev);
    if (cause < 0 || cause > 1 || !count) return INVALID_ARGUMENT;
    unsigned int n = cause == 0 ? HEALTH(dev)->retired_sbe : HEALTH(dev)->retired_dbe;
    if (n == 0) { *count = 0; return OK; }
    if (!addresses || *count < n) { *count = n; return INSUFFICIENT_SIZE; }
    for (unsigned int k = 0; k < n; k++) addresses[k] = 0x100000ULL * (k + 1) + (cause << 12);
    *count = n;
    return OK;
}
EXPORT int nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t dev, int *pending) {
    ENTER(dev); *pending = HEALTH(dev)->retired_pending ? 1 : 0; return OK;
}

/* isActive: NVML_FEATURE_ENABLED (1) / DISABLED (0); a GPU without NVLink, or
 * a link past its count, answers NOT_SUPPORTED / INVALID_ARGUMENT. */
EXPORT int nvmlDeviceGetNvLinkState(nvmlDevice_t dev, unsigned int link, unsigned int *active) {
    ENTER(dev);
    health_t *h = HEALTH(dev);
    if (!h->links) return NOT_SUPPORTED;
    if (link >= h->links) return INVALID_ARGUMENT;
    *active = (h->links_down >> link) & 1 ? 0 : 1;
    return OK;
}

/* nvmlGpuFabricInfo_t (v1, no version field) and nvmlGpuFabricInfo_v2_t / _v3_t
 * (nvmlGpuFabricInfoV_t: version first); versions are (N << 24) | sizeof. */
typedef struct { unsigned char clusterUuid[16]; int status; unsigned int cliqueId, state; } nvmlGpuFabricInfo_t;
typedef struct { unsigned int version; unsigned char clusterUuid[16]; int status; unsigned int cliqueId, state, healthMask;
                 unsigned char healthSummary; } nvmlGpuFabricInfoV_t;
#define FABRIC_V2 (2u << 24 | 36u)
#define FABRIC_V3 (3u << 24 | (unsigned int)sizeof(nvmlGpuFabricInfoV_t))

static int fabric_of(nvmlDevice_t dev, unsigned char *uuid, int *status, unsigned int *clique, unsigned int *state) {
    health_t *h = HEALTH(dev);
    if (!h->fabric) return NOT_SUPPORTED;
    memset(uuid, 0, 16); uuid[0] = 0xfa; uuid[15] = 0xb1;
    *status = h->fabric_status; *clique = 1; *state = h->fabric_state;
    return OK;
}
EXPORT int nvmlDeviceGetGpuFabricInfo(nvmlDevice_t dev, nvmlGpuFabricInfo_t *info) {
    ENTER(dev);
    if (!info) return INVALID_ARGUMENT;
    return fabric_of(dev, info->clusterUuid, &info->status, &info->cliqueId, &info->state);
}
#ifndef FAKENVML_OLD_DRIVER
EXPORT int nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t dev, nvmlGpuFabricInfoV_t *info) {
    ENTER(dev);
    if (!info) return INVALID_ARGUMENT;
    if (info->version != FABRIC_V2 && info->version != FABRIC_V3) return ARGUMENT_VERSION_MISMATCH;
    int rc = fabric_of(dev, info->clusterUuid, &info->status, &info->cliqueId, &info->state);
    if (rc == OK) info->healthMask = 0;
    if (rc == OK && info->version == FABRIC_V3) info->healthSummary = 1;   /* HEALTHY */
    return rc;
}
#endif

/* -- utilization -------------------------------------------------------------- */
EXPORT int nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t *u) {
    ENTER(dev); u->gpu = util_at(dev->index, now()); u->memory = u->gpu / 2; return OK;
}

/* The driver's ring buffer: a sample every sample_period seconds, the last
 * SAMPLE_BUFFER kept; with sparse_idle only every sixth sample under 5 % exists. */
EXPORT int nvmlDeviceGetSamples(nvmlDevice_t dev, int type, unsigned long long last_seen,
                                int *value_type, unsigned int *count, nvmlSample_t *samples) {
    ENTER(dev);
    if (type != 1) return NOT_SUPPORTED;
    unsigned int i = dev->index, n = 0;
    if (sc.no_samples[i]) return NOT_FOUND;
    long long newest = (long long)(now() / sc.sample_period);
    long long first = newest - SAMPLE_BUFFER + 1 < 0 ? 0 : newest - SAMPLE_BUFFER + 1;
    unsigned int capacity = samples ? *count : SAMPLE_BUFFER;
    for (long long k = first; k <= newest && n < capacity; k++) {
        unsigned long long ts = origin_epoch_us + (unsigned long long)llround(k * sc.sample_period * 1e6);
        unsigned int value = util_at(i, k * sc.sample_period);
        if (ts <= last_seen || (sc.sparse_idle[i] && value < 5 && k % 6)) continue;
        if (samples) { samples[n].timeStamp = ts; samples[n].sampleValue.uiVal = value; }
        n++;
    }
    *value_type = 1;
    if (n == 0) return NOT_FOUND;
    if (!samples) { *count = SAMPLE_BUFFER; return OK; }
    *count = n;
    return OK;
}

/* -- processes ------------------------------------------------------------------ */
#ifndef FAKENVML_OLD_DRIVER
/* On a GPU handle every process of the GPU (in MIG mode with its instance ids,
 * as NVML gives them to root); on a MIG handle those of that instance. */
EXPORT int nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned int *count, nvmlProcessInfo_t *infos) {
    ENTER_ANY(dev);
    unsigned int n = 0, i = dev->index;
    for (int k = 0; k < sc.nprocesses; k++) {
        process_t *p = &sc.processes[k];
        if (p->gpu != (int)i) continue;
        int on_mig = sc.mig[i] && p->gi >= 0 && instance_slot(i, (unsigned int)p->gi) >= 0;
        if (is_mig_handle(dev) && (!on_mig || (unsigned int)p->gi != INSTANCE(dev)->id)) continue;
        if (!is_mig_handle(dev) && sc.mig[i] != (p->gi >= 0)) continue;  /* no process outside an instance in MIG mode */
        if (infos && n < *count)
            infos[n] = (nvmlProcessInfo_t){p->pid, p->bytes, on_mig ? (unsigned int)p->gi : NO_INSTANCE,
                                           on_mig ? 0 : NO_INSTANCE};
        n++;
    }
    if (n > *count || (!infos && n > 0)) { *count = n; return INSUFFICIENT_SIZE; }
    *count = n;
    return OK;
}
#endif

/* -- MIG: mode, MIG device handles (README.md, "MIG") ------------------------ */
EXPORT int nvmlDeviceGetMigMode(nvmlDevice_t dev, unsigned int *current, unsigned int *pending) {
    ENTER(dev); *current = *pending = sc.mig[dev->index] ? 1 : 0; return OK;
}
EXPORT int nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t dev, unsigned int *count) {
    ENTER(dev); *count = sc.mig[dev->index] ? MAX_MIG : 0; return OK;
}
/* Live instances in scenario order; NOT_FOUND for an index no instance occupies. */
EXPORT int nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t dev, unsigned int index, nvmlDevice_t *mig) {
    ENTER(dev);
    if (!sc.mig[dev->index] || index >= MAX_MIG) return INVALID_ARGUMENT;
    for (int k = 0, n = 0; k < sc.ninstances[dev->index]; k++)
        if (instance_live(dev->index, k) && n++ == (int)index) { *mig = &mig_devices[dev->index][k]; return OK; }
    return NOT_FOUND;
}
EXPORT int nvmlDeviceIsMigDeviceHandle(nvmlDevice_t dev, unsigned int *is_mig) {
    ENTER_ANY(dev); *is_mig = is_mig_handle(dev) ? 1 : 0; return OK;
}
EXPORT int nvmlDeviceGetGpuInstanceId(nvmlDevice_t dev, unsigned int *id) {
    ENTER_ANY(dev); if (!is_mig_handle(dev)) return INVALID_ARGUMENT; *id = INSTANCE(dev)->id; return OK;
}
EXPORT int nvmlDeviceGetComputeInstanceId(nvmlDevice_t dev, unsigned int *id) {
    ENTER_ANY(dev); if (!is_mig_handle(dev)) return INVALID_ARGUMENT; *id = 0; return OK;
}
EXPORT int nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t dev, nvmlDevice_t *gpu) {
    ENTER_ANY(dev); if (!is_mig_handle(dev)) return INVALID_ARGUMENT; *gpu = &devices[dev->index]; return OK;
}

/* -- events: XIDs scheduled by the scenario, delivered once per event set to
 * devices registered before they happen -------------------------------------- */
EXPORT int nvmlEventSetCreate(nvmlEventSet_t *set) {
    ENTER(NULL);
    *set = calloc(1, sizeof **set);
    return *set ? OK : UNKNOWN;
}

EXPORT int nvmlDeviceRegisterEvents(nvmlDevice_t dev, unsigned long long types, nvmlEventSet_t set) {
    ENTER(dev);
    pthread_mutex_lock(&lock);
    set->mask[dev->index] |= types; set->since[dev->index] = now();
    pthread_mutex_unlock(&lock);
    return OK;
}

__attribute__((unused)) static int next_event(nvmlEventSet_t set, nvmlEventData_t *data) {
    int best = -1; double t = now();
    for (int k = 0; k < sc.nxids; k++) {
        xid_t *x = &sc.xids[k];
        if (set->delivered[k] || x->gpu < 0 || x->gpu >= sc.count || !(set->mask[x->gpu] & 8)) continue;
        if (x->at < set->since[x->gpu] || x->at > t) continue;
        if (best < 0 || x->at < sc.xids[best].at) best = k;
    }
    if (best < 0) return TIMEOUT;
    set->delivered[best] = 1;
    *data = (nvmlEventData_t){&devices[sc.xids[best].gpu], 8, sc.xids[best].code, 0xFFFFFFFFu, 0xFFFFFFFFu};
    return OK;
}

/* Time of the earliest undelivered XID for this set that is due after t. */
__attribute__((unused)) static double next_xid_after(nvmlEventSet_t set, double t) {
    double next = 1e300;
    for (int k = 0; k < sc.nxids; k++) {
        xid_t *x = &sc.xids[k];
        if (set->delivered[k] || x->gpu < 0 || x->gpu >= sc.count || !(set->mask[x->gpu] & 8)) continue;
        if (x->at >= t && x->at < next) next = x->at;
    }
    return next;
}

#ifndef FAKENVML_OLD_DRIVER
EXPORT int nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    ENTER(NULL);
    double deadline = monotonic() + timeout_ms / 1000.0;
    for (;;) {
        pthread_mutex_lock(&lock);
        int rc = next_event(set, data);
        pthread_mutex_unlock(&lock);
        if (rc != TIMEOUT || monotonic() >= deadline) return rc;
        /* Real NVML blocks in the driver; on the real clock sleep until the next
         * scheduled XID or the deadline, on a frozen clock poll every 25 ms. */
        double nap = 0.025, left = deadline - monotonic();
        if (manual_time < 0) {
            pthread_mutex_lock(&lock);
            nap = next_xid_after(set, now()) - now();
            pthread_mutex_unlock(&lock);
        }
        if (nap > left) nap = left;
        if (nap < 0.001) nap = 0.001;
        struct timespec pause = {(time_t)nap, (long)((nap - (time_t)nap) * 1e9)};
        nanosleep(&pause, NULL);
        if ((rc = check(NULL, __func__))) return rc;
    }
}
#endif

EXPORT int nvmlEventSetFree(nvmlEventSet_t set) { ENTER(NULL); free(set); return OK; }


/* -- GPM: sample buffers from a fixed pool (so that a stale or freed pointer
 * is caught, not dereferenced), each stamped with its GPU and the fake time;
 * metrics are the scenario's percentages, constant over any interval ------- */
#define GPM_POOL 512
#define GPM_METRIC_MAX 477      /* NVML_GPM_METRIC_MAX as pynvml 13 declares it */
struct nvmlGpmSample_st { int in_use, taken; unsigned int gpu; int gi; double t; }; /* gi -1: the whole GPU */
typedef struct nvmlGpmSample_st *nvmlGpmSample_t;
typedef struct { unsigned int version, isSupportedDevice; } nvmlGpmSupport_t;
typedef struct { char *shortName, *longName, *unit; } nvmlGpmMetricInfo_t;
typedef struct { unsigned int metricId; int nvmlReturn; double value; nvmlGpmMetricInfo_t metricInfo; } nvmlGpmMetric_t;
typedef struct { unsigned int version, numMetrics; nvmlGpmSample_t sample1, sample2;
                 nvmlGpmMetric_t metrics[GPM_METRIC_MAX]; } nvmlGpmMetricsGet_t;

static struct nvmlGpmSample_st gpm_pool[GPM_POOL];
static unsigned long long gpm_allocs, gpm_frees, gpm_samples;

EXPORT unsigned long long fakenvml_gpm_allocs(void) { return __atomic_load_n(&gpm_allocs, __ATOMIC_RELAXED); }
EXPORT unsigned long long fakenvml_gpm_frees(void) { return __atomic_load_n(&gpm_frees, __ATOMIC_RELAXED); }
EXPORT unsigned long long fakenvml_gpm_samples(void) { return __atomic_load_n(&gpm_samples, __ATOMIC_RELAXED); }

__attribute__((unused)) static int in_pool(nvmlGpmSample_t s) { return s >= gpm_pool && s < gpm_pool + GPM_POOL && s->in_use; }

/* Percent of metric `id` on GPU i: sm, occupancy, tensor, dram from the scenario;
 * pipes derived from them (HMMA = tensor, FP32 = sm / 2, FP16 = sm / 4, IMMA,
 * DFMA, FP64 = 0). Returns NOT_SUPPORTED for a metric the scenario leaves out. */
__attribute__((unused)) static int gpm_value(unsigned int i, gpm_t g, unsigned int id, double *value, const char **name) {
    for (int k = 0; k < sc.ngpm_missing; k++)
        if ((sc.gpm_missing[k].gpu < 0 || sc.gpm_missing[k].gpu == (int)i) && sc.gpm_missing[k].metric == id) return NOT_SUPPORTED;
    switch (id) {
    case 2: *value = g.sm; *name = "SM_UTIL"; break;
    case 3: *value = g.occupancy; *name = "SM_OCCUPANCY"; break;
    case 5: *value = g.tensor; *name = "ANY_TENSOR_UTIL"; break;
    case 6: *value = 0; *name = "DFMA_TENSOR_UTIL"; break;
    case 7: *value = g.tensor; *name = "HMMA_TENSOR_UTIL"; break;
    case 9: *value = 0; *name = "IMMA_TENSOR_UTIL"; break;
    case 10: *value = g.dram; *name = "DRAM_BW_UTIL"; break;
    case 11: *value = 0; *name = "FP64_UTIL"; break;
    case 12: *value = g.sm / 2; *name = "FP32_UTIL"; break;
    case 13: *value = g.sm / 4; *name = "FP16_UTIL"; break;
    default: return NOT_SUPPORTED;
    }
    return OK;
}

#ifndef FAKENVML_OLD_DRIVER
EXPORT int nvmlGpmQueryDeviceSupport(nvmlDevice_t dev, nvmlGpmSupport_t *support) {
    ENTER(dev);
    if (!support) return INVALID_ARGUMENT;
    if (support->version != sc.gpm_version) return ARGUMENT_VERSION_MISMATCH;
    support->isSupportedDevice = gpm_supported(dev->index);
    return OK;
}

EXPORT int nvmlGpmSampleAlloc(nvmlGpmSample_t *sample) {
    ENTER(NULL);
    if (!sample) return INVALID_ARGUMENT;
    pthread_mutex_lock(&lock);
    int rc = MEMORY;
    for (int k = 0; k < GPM_POOL; k++)
        if (!gpm_pool[k].in_use) {
            gpm_pool[k] = (struct nvmlGpmSample_st){1, 0, 0, -1, 0};
            *sample = &gpm_pool[k]; gpm_allocs++; rc = OK;
            break;
        }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* Like freeing host memory, this works without a session (after a driver
 * reload too); a pointer not allocated, or freed already, is refused. */
EXPORT int nvmlGpmSampleFree(nvmlGpmSample_t sample) {
    __atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&lock);
    int rc = in_pool(sample) ? OK : INVALID_ARGUMENT;
    if (rc == OK) { sample->in_use = 0; gpm_frees++; }
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT int nvmlGpmSampleGet(nvmlDevice_t dev, nvmlGpmSample_t sample) {
    ENTER(dev);
    if (!gpm_supported(dev->index)) return NOT_SUPPORTED;
    pthread_mutex_lock(&lock);
    int rc = in_pool(sample) ? OK : INVALID_ARGUMENT;
    if (rc == OK) { sample->taken = 1; sample->gpu = dev->index; sample->gi = -1; sample->t = now(); gpm_samples++; }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* A sample of one GPU instance of a GPU in MIG mode (dev: the GPU's handle). */
EXPORT int nvmlGpmMigSampleGet(nvmlDevice_t dev, unsigned int gpu_instance_id, nvmlGpmSample_t sample) {
    ENTER(dev);
    if (!gpm_supported(dev->index)) return NOT_SUPPORTED;
    if (!sc.mig[dev->index] || instance_slot(dev->index, gpu_instance_id) < 0) return INVALID_ARGUMENT;
    pthread_mutex_lock(&lock);
    int rc = in_pool(sample) ? OK : INVALID_ARGUMENT;
    if (rc == OK) {
        sample->taken = 1; sample->gpu = dev->index; sample->gi = (int)gpu_instance_id;
        sample->t = now(); gpm_samples++;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* sample1 must be the older sample of the same GPU as sample2 (as in NVML). */
EXPORT int nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *request) {
    ENTER(NULL);
    if (!request) return INVALID_ARGUMENT;
    if (request->version != sc.gpm_version) return ARGUMENT_VERSION_MISMATCH;
    if (request->numMetrics > GPM_METRIC_MAX) return INVALID_ARGUMENT;
    pthread_mutex_lock(&lock);
    nvmlGpmSample_t s1 = request->sample1, s2 = request->sample2;
    int rc = in_pool(s1) && in_pool(s2) && s1->taken && s2->taken && s1->gpu == s2->gpu
             && s1->gi == s2->gi && s2->t > s1->t ? OK : INVALID_ARGUMENT;
    unsigned int gpu = rc == OK ? s1->gpu : 0;
    int slot = rc == OK && s1->gi >= 0 ? instance_slot(gpu, (unsigned int)s1->gi) : -1;
    if (rc == OK && s1->gi >= 0 && slot < 0) rc = INVALID_ARGUMENT;   /* the instance is gone */
    gpm_t activity = slot >= 0 ? sc.instances[gpu][slot].gpm : sc.gpm[gpu];
    pthread_mutex_unlock(&lock);
    if (rc) return rc;
    static char unit[] = "%", empty[] = "";
    for (unsigned int k = 0; k < request->numMetrics; k++) {
        nvmlGpmMetric_t *m = &request->metrics[k];
        const char *name = empty;
        m->value = 0;
        m->nvmlReturn = gpm_value(gpu, activity, m->metricId, &m->value, &name);
        m->metricInfo.shortName = (char *)name; m->metricInfo.longName = (char *)name;
        m->metricInfo.unit = m->nvmlReturn == OK ? unit : empty;
    }
    return OK;
}
#endif
