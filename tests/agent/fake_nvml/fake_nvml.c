/*
 * A fake libnvidia-ml.so.1 for tests on machines without an NVIDIA GPU.
 *
 * It exports the NVML entry points (with the symbol versions pynvml looks up) that the Kumiki node
 * agent calls, with NVML's calling conventions and struct layouts, so the agent's pynvml code runs
 * unchanged. The GPUs and their readings come from an INI-like file named by FAKE_NVML_CONFIG, read
 * by the first nvmlInit after the library is loaded or fully shut down (init is reference counted,
 * as in NVML); see docs/agent.md for the format and tests/agent/fake_nvml/build.py for a writer.
 *
 * Build: gcc -shared -fPIC -Wall -Wextra -Werror -Wl,-soname,libnvidia-ml.so.1 \
 *            -o libnvidia-ml.so.1 fake_nvml.c
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 16
#define MAX_MIGS 7
#define MAX_PATTERN 64
#define MAX_XIDS 64
#define MAX_NVLINKS 36
#define MAX_TEXT 96

#define XID_CRITICAL_EVENT 0x8ULL
#define NO_INSTANCE 0xFFFFFFFFu

/* Fields whose NVML getters can be told to fail (errors = field:code, unsupported = field,...). */
enum field_id {
    F_NAME, F_UUID, F_MEMORY, F_MEMORY_V2, F_UTILIZATION, F_POWER, F_TEMPERATURE, F_ECC, F_MIG,
    F_NVLINK, F_TOPOLOGY, F_PCI, F_EVENTS, F_P2P, F_GPU_INSTANCE, F_COUNT
};
static const char *const FIELD_NAMES[F_COUNT] = {
    "name", "uuid", "memory", "memory_v2", "utilization", "power", "temperature", "ecc", "mig",
    "nvlink", "topology", "pci", "events", "p2p", "gpu_instance",
};

struct nvmlDevice_st {
    int gpu;      /* index of the physical GPU */
    int mig;      /* -1 for the GPU itself, else the slot in its MIG device list */
};
typedef struct nvmlDevice_st *nvmlDevice_t;

/* A GPU instance handle (nvmlGpuInstance_t) points at the MIG device that represents it. */
struct nvmlGpuInstance_st {
    struct nvmlDevice_st *device;
};
typedef struct nvmlGpuInstance_st *nvmlGpuInstance_t;

typedef struct {
    struct nvmlDevice_st handle;
    struct nvmlGpuInstance_st instance;
    unsigned gpu_instance;
    unsigned compute_instance;
    char uuid[MAX_TEXT];
    char name[MAX_TEXT];
    unsigned long long memory_total;
    unsigned long long memory_used;
    unsigned slices;
    unsigned profile_id;
    unsigned placement_start;
} fake_mig;

typedef struct {
    struct nvmlDevice_st handle;
    char uuid[MAX_TEXT];
    char name[MAX_TEXT];
    char bus_id[32];
    unsigned long long memory_total;
    unsigned long long memory_used;
    unsigned long long memory_reserved;  /* driver-reserved: inside v1 "used", apart in v2 */
    unsigned util_gpu[MAX_PATTERN];
    int util_gpu_len;
    unsigned util_memory[MAX_PATTERN];
    int util_memory_len;
    unsigned long util_calls;
    unsigned power_mw;
    unsigned temperature_c;
    unsigned long long ecc_corrected;
    unsigned long long ecc_uncorrected;
    int mig_mode;           /* 0 off, 1 on, -1 not supported */
    fake_mig migs[MAX_MIGS];
    int mig_count;
    int nvlink_count;       /* links the GPU has; 0 = no NVLink (NOT_SUPPORTED) */
    int nvlink_peer[MAX_NVLINKS]; /* peer GPU per link, -1 inactive */
    nvmlReturn_t errors[F_COUNT];
} fake_gpu;

typedef struct {
    int gpu;
    unsigned long long code;
    unsigned gpu_instance;
    unsigned long drain;    /* delivered once this many earlier waits have found no event */
    int delivered;
} fake_xid;

static struct {
    int initialised;
    char driver_version[MAX_TEXT];
    int cuda_version;
    int topology_default;
    int topology[MAX_GPUS][MAX_GPUS];
    fake_gpu gpus[MAX_GPUS];
    int gpu_count;
    fake_xid xids[MAX_XIDS];
    int xid_count;
    unsigned long empty_waits;
} fake;

/* One registered event set; the fake keeps a single global queue, so one set is enough. */
struct nvmlEventSet_st {
    unsigned long long mask[MAX_GPUS];
};
typedef struct nvmlEventSet_st *nvmlEventSet_t;
static struct nvmlEventSet_st event_set;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned gpu, memory; } nvmlUtilization_t;
typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
typedef struct {
    unsigned multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount,
        sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount, computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

/* ---------------------------------------------------------------------------------------------- */
/* Config file parsing                                                                            */

static char parse_error[256];

static char *trim(char *text) {
    while (isspace((unsigned char)*text)) text++;
    char *end = text + strlen(text);
    while (end > text && isspace((unsigned char)end[-1])) *--end = '\0';
    return text;
}

static int parse_ull(const char *text, unsigned long long *out) {
    char *end;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 0);
    if (errno || end == text || *trim(end) != '\0' || text[0] == '-') return -1;
    *out = value;
    return 0;
}

static int parse_pattern(char *text, unsigned *out, int *len) {
    *len = 0;
    for (char *item = strtok(text, ","); item; item = strtok(NULL, ",")) {
        unsigned long long value;
        if (*len >= MAX_PATTERN || parse_ull(trim(item), &value)) return -1;
        out[(*len)++] = (unsigned)value;
    }
    return *len > 0 ? 0 : -1;
}

static int field_id(const char *name) {
    for (int i = 0; i < F_COUNT; i++)
        if (strcmp(name, FIELD_NAMES[i]) == 0) return i;
    return -1;
}

/* "power,ecc" -> NOT_SUPPORTED; "temperature:15,power:3" -> those codes. */
static int parse_errors(char *text, nvmlReturn_t *errors, int default_code) {
    for (char *item = strtok(text, ","); item; item = strtok(NULL, ",")) {
        item = trim(item);
        char *colon = strchr(item, ':');
        unsigned long long code = (unsigned long long)default_code;
        if (colon) {
            *colon = '\0';
            if (parse_ull(colon + 1, &code) || code == 0) return -1;
        } else if (default_code == 0) {
            return -1;
        }
        int id = field_id(trim(item));
        if (id < 0) return -1;
        errors[id] = (nvmlReturn_t)code;
    }
    return 0;
}

static int topology_level(const char *text, int *out) {
    static const struct { const char *name; int level; } names[] = {
        {"INTERNAL", 0}, {"SINGLE", 10}, {"MULTIPLE", 20}, {"HOSTBRIDGE", 30}, {"NODE", 40},
        {"SYSTEM", 50},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(text, names[i].name) == 0) { *out = names[i].level; return 0; }
    unsigned long long value;
    if (parse_ull(text, &value)) return -1;
    *out = (int)value;
    return 0;
}

enum section { S_NONE, S_SYSTEM, S_GPU, S_MIG, S_NVLINK, S_TOPOLOGY, S_XID };

/* Pending pair sections are applied when the next section starts (or at the end of the file). */
static struct { int a, b, links, level; char level_text[32]; } pair;
static fake_xid pending_xid;
static int pending_mig_gpu;
static fake_mig pending_mig;

static int finish_section(enum section section) {
    if (section == S_MIG) {
        if (pending_mig_gpu < 0 || pending_mig_gpu >= fake.gpu_count) {
            snprintf(parse_error, sizeof parse_error, "[mig] gpu %d is not a configured GPU",
                     pending_mig_gpu);
            return -1;
        }
        fake_gpu *gpu = &fake.gpus[pending_mig_gpu];
        if (gpu->mig_count >= MAX_MIGS) {
            snprintf(parse_error, sizeof parse_error, "more than %d MIG devices on GPU %d", MAX_MIGS,
                     pending_mig_gpu);
            return -1;
        }
        pending_mig.handle.gpu = pending_mig_gpu;
        pending_mig.handle.mig = gpu->mig_count;
        gpu->migs[gpu->mig_count] = pending_mig;
        gpu->migs[gpu->mig_count].instance.device = &gpu->migs[gpu->mig_count].handle;
        gpu->mig_count++;
    } else if (section == S_NVLINK) {
        if (pair.a < 0 || pair.b < 0 || pair.a >= fake.gpu_count || pair.b >= fake.gpu_count ||
            pair.a == pair.b || pair.links <= 0) {
            snprintf(parse_error, sizeof parse_error, "[nvlink] needs two distinct GPUs and links > 0");
            return -1;
        }
        for (int n = 0; n < pair.links; n++) {
            int ends[2] = {pair.a, pair.b};
            for (int e = 0; e < 2; e++) {
                fake_gpu *gpu = &fake.gpus[ends[e]];
                int link = 0;
                while (link < gpu->nvlink_count && gpu->nvlink_peer[link] >= 0) link++;
                if (link >= gpu->nvlink_count) {
                    snprintf(parse_error, sizeof parse_error,
                             "[nvlink] GPU %d has no free link (nvlink_count %d)", ends[e],
                             gpu->nvlink_count);
                    return -1;
                }
                gpu->nvlink_peer[link] = ends[1 - e];
            }
        }
    } else if (section == S_TOPOLOGY) {
        if (pair.a < 0 || pair.b < 0 || pair.a >= fake.gpu_count || pair.b >= fake.gpu_count ||
            topology_level(pair.level_text, &pair.level)) {
            snprintf(parse_error, sizeof parse_error, "[topology] needs two GPUs and a level");
            return -1;
        }
        fake.topology[pair.a][pair.b] = fake.topology[pair.b][pair.a] = pair.level;
    } else if (section == S_XID) {
        if (pending_xid.gpu < 0 || pending_xid.gpu >= fake.gpu_count || pending_xid.code == 0 ||
            fake.xid_count >= MAX_XIDS) {
            snprintf(parse_error, sizeof parse_error, "[xid] needs a configured gpu and a code");
            return -1;
        }
        fake.xids[fake.xid_count++] = pending_xid;
    }
    return 0;
}

static int start_section(const char *name, enum section *section) {
    if (finish_section(*section)) return -1;
    if (strcmp(name, "system") == 0) {
        *section = S_SYSTEM;
    } else if (strcmp(name, "gpu") == 0) {
        if (fake.gpu_count >= MAX_GPUS) {
            snprintf(parse_error, sizeof parse_error, "more than %d GPUs", MAX_GPUS);
            return -1;
        }
        fake_gpu *gpu = &fake.gpus[fake.gpu_count];
        memset(gpu, 0, sizeof *gpu);
        gpu->handle.gpu = fake.gpu_count;
        gpu->handle.mig = -1;
        gpu->mig_mode = -1;
        for (int link = 0; link < MAX_NVLINKS; link++) gpu->nvlink_peer[link] = -1;
        snprintf(gpu->bus_id, sizeof gpu->bus_id, "00000000:%02X:00.0", 0x10 + fake.gpu_count);
        fake.gpu_count++;
        *section = S_GPU;
    } else if (strcmp(name, "mig") == 0) {
        memset(&pending_mig, 0, sizeof pending_mig);
        pending_mig.compute_instance = 0;
        pending_mig_gpu = -1;
        *section = S_MIG;
    } else if (strcmp(name, "nvlink") == 0 || strcmp(name, "topology") == 0) {
        memset(&pair, 0, sizeof pair);
        pair.a = pair.b = -1;
        *section = name[0] == 'n' ? S_NVLINK : S_TOPOLOGY;
    } else if (strcmp(name, "xid") == 0) {
        memset(&pending_xid, 0, sizeof pending_xid);
        pending_xid.gpu = -1;
        pending_xid.gpu_instance = NO_INSTANCE;
        *section = S_XID;
    } else {
        snprintf(parse_error, sizeof parse_error, "unknown section [%s]", name);
        return -1;
    }
    return 0;
}

static int copy_text(char *dest, size_t size, const char *value) {
    if (strlen(value) >= size) return -1;
    strcpy(dest, value);
    return 0;
}

static int set_key(enum section section, const char *key, char *value) {
    unsigned long long number = 0;
    int numeric = parse_ull(value, &number) == 0;
#define NUM(target) do { if (!numeric) return -1; (target) = number; } while (0)
    if (section == S_SYSTEM) {
        if (!strcmp(key, "driver_version")) return copy_text(fake.driver_version, MAX_TEXT, value);
        if (!strcmp(key, "cuda_version")) { NUM(fake.cuda_version); return 0; }
        if (!strcmp(key, "topology_default")) return topology_level(value, &fake.topology_default);
    } else if (section == S_GPU) {
        fake_gpu *gpu = &fake.gpus[fake.gpu_count - 1];
        if (!strcmp(key, "uuid")) return copy_text(gpu->uuid, MAX_TEXT, value);
        if (!strcmp(key, "name")) return copy_text(gpu->name, MAX_TEXT, value);
        if (!strcmp(key, "bus_id")) return copy_text(gpu->bus_id, sizeof gpu->bus_id, value);
        if (!strcmp(key, "memory_total")) { NUM(gpu->memory_total); return 0; }
        if (!strcmp(key, "memory_used")) { NUM(gpu->memory_used); return 0; }
        if (!strcmp(key, "memory_reserved")) { NUM(gpu->memory_reserved); return 0; }
        if (!strcmp(key, "util_gpu")) return parse_pattern(value, gpu->util_gpu, &gpu->util_gpu_len);
        if (!strcmp(key, "util_memory"))
            return parse_pattern(value, gpu->util_memory, &gpu->util_memory_len);
        if (!strcmp(key, "power_mw")) { NUM(gpu->power_mw); return 0; }
        if (!strcmp(key, "temperature_c")) { NUM(gpu->temperature_c); return 0; }
        if (!strcmp(key, "ecc_corrected")) { NUM(gpu->ecc_corrected); return 0; }
        if (!strcmp(key, "ecc_uncorrected")) { NUM(gpu->ecc_uncorrected); return 0; }
        if (!strcmp(key, "nvlink_count")) {
            NUM(gpu->nvlink_count);
            return gpu->nvlink_count <= MAX_NVLINKS ? 0 : -1;
        }
        if (!strcmp(key, "mig")) {
            if (!strcmp(value, "on")) gpu->mig_mode = 1;
            else if (!strcmp(value, "off")) gpu->mig_mode = 0;
            else if (!strcmp(value, "unsupported")) gpu->mig_mode = -1;
            else return -1;
            return 0;
        }
        if (!strcmp(key, "unsupported")) return parse_errors(value, gpu->errors, NVML_ERROR_NOT_SUPPORTED);
        if (!strcmp(key, "errors")) return parse_errors(value, gpu->errors, 0);
    } else if (section == S_MIG) {
        if (!strcmp(key, "gpu")) { NUM(pending_mig_gpu); return 0; }
        if (!strcmp(key, "gpu_instance")) { NUM(pending_mig.gpu_instance); return 0; }
        if (!strcmp(key, "compute_instance")) { NUM(pending_mig.compute_instance); return 0; }
        if (!strcmp(key, "uuid")) return copy_text(pending_mig.uuid, MAX_TEXT, value);
        if (!strcmp(key, "name")) return copy_text(pending_mig.name, MAX_TEXT, value);
        if (!strcmp(key, "memory_total")) { NUM(pending_mig.memory_total); return 0; }
        if (!strcmp(key, "memory_used")) { NUM(pending_mig.memory_used); return 0; }
        if (!strcmp(key, "slices")) { NUM(pending_mig.slices); return 0; }
        if (!strcmp(key, "profile_id")) { NUM(pending_mig.profile_id); return 0; }
        if (!strcmp(key, "placement_start")) { NUM(pending_mig.placement_start); return 0; }
    } else if (section == S_NVLINK || section == S_TOPOLOGY) {
        if (!strcmp(key, "a")) { NUM(pair.a); return 0; }
        if (!strcmp(key, "b")) { NUM(pair.b); return 0; }
        if (!strcmp(key, "links") && section == S_NVLINK) { NUM(pair.links); return 0; }
        if (!strcmp(key, "level") && section == S_TOPOLOGY)
            return copy_text(pair.level_text, sizeof pair.level_text, value);
    } else if (section == S_XID) {
        if (!strcmp(key, "gpu")) { NUM(pending_xid.gpu); return 0; }
        if (!strcmp(key, "code")) { NUM(pending_xid.code); return 0; }
        if (!strcmp(key, "gpu_instance")) { NUM(pending_xid.gpu_instance); return 0; }
        if (!strcmp(key, "drain")) { NUM(pending_xid.drain); return 0; }
    }
#undef NUM
    return -1;
}

static int load_config(void) {
    const char *path = getenv("FAKE_NVML_CONFIG");
    memset(&fake, 0, sizeof fake);
    memset(&event_set, 0, sizeof event_set);
    parse_error[0] = '\0';
    fake.cuda_version = 12040;
    fake.topology_default = 50;
    strcpy(fake.driver_version, "550.54.15");
    for (int a = 0; a < MAX_GPUS; a++)
        for (int b = 0; b < MAX_GPUS; b++) fake.topology[a][b] = -1;
    if (!path || !*path) {
        snprintf(parse_error, sizeof parse_error, "FAKE_NVML_CONFIG is not set");
        return -1;
    }
    FILE *file = fopen(path, "r");
    if (!file) {
        snprintf(parse_error, sizeof parse_error, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    char line[512];
    int line_number = 0;
    enum section section = S_NONE;
    int status = 0;
    while (status == 0 && fgets(line, sizeof line, file)) {
        line_number++;
        char *text = trim(line);
        if (!*text || *text == '#') continue;
        if (*text == '[') {
            char *close = strchr(text, ']');
            if (!close) { status = -1; break; }
            *close = '\0';
            status = start_section(trim(text + 1), &section);
            continue;
        }
        char *equals = strchr(text, '=');
        if (!equals || section == S_NONE) { status = -1; break; }
        *equals = '\0';
        status = set_key(section, trim(text), trim(equals + 1));
    }
    if (status == 0) status = finish_section(section);
    fclose(file);
    if (status && !parse_error[0])
        snprintf(parse_error, sizeof parse_error, "%s:%d: bad line", path, line_number);
    return status;
}

/* ---------------------------------------------------------------------------------------------- */
/* Helpers                                                                                        */

static fake_gpu *gpu_of(nvmlDevice_t device) {
    if (!device || device->gpu < 0 || device->gpu >= fake.gpu_count) return NULL;
    return &fake.gpus[device->gpu];
}

static fake_mig *mig_of(nvmlDevice_t device) {
    fake_gpu *gpu = gpu_of(device);
    if (!gpu || device->mig < 0 || device->mig >= gpu->mig_count) return NULL;
    return &gpu->migs[device->mig];
}

#define CHECK_INIT() do { if (!fake.initialised) return NVML_ERROR_UNINITIALIZED; } while (0)
#define DEVICE(var, device) \
    CHECK_INIT(); \
    fake_gpu *var = gpu_of(device); \
    if (!var) return NVML_ERROR_INVALID_ARGUMENT
#define FAIL_IF(gpu, field) do { if ((gpu)->errors[field]) return (gpu)->errors[field]; } while (0)

static nvmlReturn_t copy_out(char *dest, unsigned length, const char *value) {
    if (!dest) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(dest, value);
    return NVML_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------- */
/* Entry points                                                                                   */

/* Like real NVML, init and shutdown are reference counted; the config is read on the first init. */
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned flags) {
    (void)flags;
    if (fake.initialised > 0) {
        fake.initialised++;
        return NVML_SUCCESS;
    }
    if (load_config()) {
        fprintf(stderr, "fake NVML: %s\n", parse_error);
        return NVML_ERROR_UNKNOWN;
    }
    fake.initialised = 1;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    CHECK_INIT();
    fake.initialised--;
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned length) {
    CHECK_INIT();
    return copy_out(version, length, fake.driver_version);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    CHECK_INIT();
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    *version = fake.cuda_version;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    return nvmlSystemGetCudaDriverVersion(version);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *count) {
    CHECK_INIT();
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned)fake.gpu_count;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t *device) {
    CHECK_INIT();
    if (!device || index >= (unsigned)fake.gpu_count) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &fake.gpus[index].handle;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned *index) {
    DEVICE(gpu, device);
    if (!index || device->mig >= 0) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)device->gpu;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned length) {
    DEVICE(gpu, device);
    FAIL_IF(gpu, F_NAME);
    fake_mig *mig = mig_of(device);
    return copy_out(name, length, mig ? mig->name : gpu->name);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned length) {
    DEVICE(gpu, device);
    FAIL_IF(gpu, F_UUID);
    fake_mig *mig = mig_of(device);
    return copy_out(uuid, length, mig ? mig->uuid : gpu->uuid);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    DEVICE(gpu, device);
    FAIL_IF(gpu, F_PCI);
    if (!pci || device->mig >= 0) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    strncpy(pci->busId, gpu->bus_id, sizeof pci->busId - 1);
    /* busIdLegacy has a 4-digit domain, like the real thing. */
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", gpu->bus_id + 4);
    sscanf(gpu->bus_id, "%x:%x:%x", &pci->domain, &pci->bus, &pci->device);
    pci->pciDeviceId = 0x20B510DE;
    return NVML_SUCCESS;
}

static nvmlReturn_t memory_of(nvmlDevice_t device, fake_gpu *gpu, unsigned long long *total,
                              unsigned long long *used, unsigned long long *reserved) {
    FAIL_IF(gpu, F_MEMORY);
    fake_mig *mig = mig_of(device);
    *total = mig ? mig->memory_total : gpu->memory_total;
    *used = mig ? mig->memory_used : gpu->memory_used;
    *reserved = mig ? 0 : gpu->memory_reserved;
    return NVML_SUCCESS;
}

/* v1, as recent drivers answer it: "used" includes the driver's reserved memory. */
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    DEVICE(gpu, device);
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long total, used, reserved;
    nvmlReturn_t status = memory_of(device, gpu, &total, &used, &reserved);
    if (status) return status;
    memory->total = total;
    memory->used = used + reserved;
    memory->free = total > used + reserved ? total - used - reserved : 0;
    return NVML_SUCCESS;
}

#define NVML_MEMORY_V2 0x02000028u

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    DEVICE(gpu, device);
    FAIL_IF(gpu, F_MEMORY_V2);
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != NVML_MEMORY_V2) return 25; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    unsigned long long total, used, reserved;
    nvmlReturn_t status = memory_of(device, gpu, &total, &used, &reserved);
    if (status) return status;
    memory->total = total;
    memory->reserved = reserved;
    memory->used = used;
    memory->free = total > used + reserved ? total - used - reserved : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *util) {
    DEVICE(gpu, device);
    FAIL_IF(gpu, F_UTILIZATION);
    /* Like real NVML: no utilisation for a MIG device, nor for a GPU with MIG enabled. */
    if (device->mig >= 0 || gpu->mig_mode == 1) return NVML_ERROR_NOT_SUPPORTED;
    if (!util) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long call = gpu->util_calls++;
    util->gpu = gpu->util_gpu_len ? gpu->util_gpu[call % (unsigned long)gpu->util_gpu_len] : 0;
    util->memory =
        gpu->util_memory_len ? gpu->util_memory[call % (unsigned long)gpu->util_memory_len] : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned *power) {
    DEVICE(gpu, device);
    FAIL_IF(gpu, F_POWER);
    if (!power || device->mig >= 0) return NVML_ERROR_NOT_SUPPORTED;
    *power = gpu->power_mw;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, unsigned sensor, unsigned *temp) {
    DEVICE(gpu, device);
    FAIL_IF(gpu, F_TEMPERATURE);
    if (sensor != 0 || !temp) return NVML_ERROR_INVALID_ARGUMENT;
    if (device->mig >= 0) return NVML_ERROR_NOT_SUPPORTED;
    *temp = gpu->temperature_c;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, unsigned error_type,
                                                unsigned counter_type, unsigned long long *count) {
    DEVICE(gpu, device);
    FAIL_IF(gpu, F_ECC);
    if (!count || error_type > 1 || counter_type > 1) return NVML_ERROR_INVALID_ARGUMENT;
    if (device->mig >= 0) return NVML_ERROR_NOT_SUPPORTED;
    *count = error_type == 0 ? gpu->ecc_corrected : gpu->ecc_uncorrected;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned *current, unsigned *pending) {
    DEVICE(gpu, device);
    FAIL_IF(gpu, F_MIG);
    if (gpu->mig_mode < 0 || device->mig >= 0) return NVML_ERROR_NOT_SUPPORTED;
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    *current = *pending = (unsigned)gpu->mig_mode;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned *count) {
    DEVICE(gpu, device);
    FAIL_IF(gpu, F_MIG);
    if (gpu->mig_mode < 0) return NVML_ERROR_NOT_SUPPORTED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = MAX_MIGS;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned index,
                                                        nvmlDevice_t *mig_device) {
    DEVICE(gpu, device);
    FAIL_IF(gpu, F_MIG);
    if (gpu->mig_mode < 0) return NVML_ERROR_NOT_SUPPORTED;
    if (!mig_device || index >= MAX_MIGS) return NVML_ERROR_INVALID_ARGUMENT;
    /* Real NVML answers NOT_FOUND for an index with no MIG device behind it. */
    if (gpu->mig_mode != 1 || index >= (unsigned)gpu->mig_count) return NVML_ERROR_NOT_FOUND;
    *mig_device = &gpu->migs[index].handle;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned *is_mig) {
    DEVICE(gpu, device);
    (void)gpu;
    if (!is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *is_mig = device->mig >= 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned *id) {
    DEVICE(gpu, device);
    (void)gpu;
    fake_mig *mig = mig_of(device);
    if (!mig) return NVML_ERROR_NOT_SUPPORTED;
    if (!id) return NVML_ERROR_INVALID_ARGUMENT;
    *id = mig->gpu_instance;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned *id) {
    DEVICE(gpu, device);
    (void)gpu;
    fake_mig *mig = mig_of(device);
    if (!mig) return NVML_ERROR_NOT_SUPPORTED;
    if (!id) return NVML_ERROR_INVALID_ARGUMENT;
    *id = mig->compute_instance;
    return NVML_SUCCESS;
}

typedef struct { unsigned start, size; } nvmlGpuInstancePlacement_t;
typedef struct {
    nvmlDevice_t device;
    unsigned id, profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned id,
                                                 nvmlGpuInstance_t *instance) {
    DEVICE(gpu, device);
    FAIL_IF(gpu, F_GPU_INSTANCE);
    if (gpu->mig_mode < 0) return NVML_ERROR_NOT_SUPPORTED;
    if (!instance || device->mig >= 0) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; gpu->mig_mode == 1 && i < gpu->mig_count; i++) {
        if (gpu->migs[i].gpu_instance == id) {
            *instance = &gpu->migs[i].instance;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t instance, nvmlGpuInstanceInfo_t *info) {
    CHECK_INIT();
    if (!instance || !info) return NVML_ERROR_INVALID_ARGUMENT;
    fake_mig *mig = mig_of(instance->device);
    if (!mig) return NVML_ERROR_INVALID_ARGUMENT;
    memset(info, 0, sizeof *info);
    info->device = &fake.gpus[instance->device->gpu].handle;
    info->id = mig->gpu_instance;
    info->profileId = mig->profile_id;
    info->placement.start = mig->placement_start;
    info->placement.size = mig->slices;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attrs) {
    DEVICE(gpu, device);
    if (!attrs) return NVML_ERROR_INVALID_ARGUMENT;
    fake_mig *mig = mig_of(device);
    memset(attrs, 0, sizeof *attrs);
    attrs->gpuInstanceSliceCount = mig ? mig->slices : 7;
    attrs->computeInstanceSliceCount = attrs->gpuInstanceSliceCount;
    attrs->multiprocessorCount = 14 * attrs->gpuInstanceSliceCount;
    attrs->memorySizeMB = (mig ? mig->memory_total : gpu->memory_total) / (1024ULL * 1024ULL);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t first, nvmlDevice_t second,
                                                        int *level) {
    DEVICE(a, first);
    fake_gpu *b = gpu_of(second);
    if (!b || !level || first->mig >= 0 || second->mig >= 0) return NVML_ERROR_INVALID_ARGUMENT;
    FAIL_IF(a, F_TOPOLOGY);
    FAIL_IF(b, F_TOPOLOGY);
    if (a == b) { *level = 0; return NVML_SUCCESS; }
    int configured = fake.topology[first->gpu][second->gpu];
    *level = configured >= 0 ? configured : fake.topology_default;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t first, nvmlDevice_t second, unsigned index,
                                           unsigned *status) {
    DEVICE(a, first);
    fake_gpu *b = gpu_of(second);
    if (!b || !status) return NVML_ERROR_INVALID_ARGUMENT;
    FAIL_IF(a, F_P2P);
    FAIL_IF(b, F_P2P);
    if (index != 2) { *status = 0; return NVML_SUCCESS; }   /* only NVLink P2P is modelled */
    int linked = 0;
    for (int link = 0; link < a->nvlink_count; link++)
        if (a->nvlink_peer[link] == second->gpu) linked = 1;
    *status = linked ? 0 /* OK */ : 5 /* NOT_SUPPORTED */;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned link, unsigned *active) {
    DEVICE(gpu, device);
    FAIL_IF(gpu, F_NVLINK);
    if (gpu->nvlink_count == 0 || device->mig >= 0) return NVML_ERROR_NOT_SUPPORTED;
    if (!active || link >= (unsigned)gpu->nvlink_count) return NVML_ERROR_INVALID_ARGUMENT;
    *active = gpu->nvlink_peer[link] >= 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned link,
                                                        nvmlPciInfo_t *pci) {
    DEVICE(gpu, device);
    FAIL_IF(gpu, F_NVLINK);
    if (gpu->nvlink_count == 0) return NVML_ERROR_NOT_SUPPORTED;
    if (!pci || link >= (unsigned)gpu->nvlink_count) return NVML_ERROR_INVALID_ARGUMENT;
    int peer = gpu->nvlink_peer[link];
    if (peer < 0) return NVML_ERROR_NOT_FOUND;
    return nvmlDeviceGetPciInfo_v3(&fake.gpus[peer].handle, pci);
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    CHECK_INIT();
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    memset(&event_set, 0, sizeof event_set);
    *set = &event_set;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    CHECK_INIT();
    if (set != &event_set) return NVML_ERROR_INVALID_ARGUMENT;
    memset(&event_set, 0, sizeof event_set);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types) {
    DEVICE(gpu, device);
    FAIL_IF(gpu, F_EVENTS);
    if (!types) return NVML_ERROR_INVALID_ARGUMENT;
    *types = XID_CRITICAL_EVENT | 0x1ULL | 0x2ULL;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types,
                                             nvmlEventSet_t set) {
    DEVICE(gpu, device);
    FAIL_IF(gpu, F_EVENTS);
    if (set != &event_set || device->mig >= 0) return NVML_ERROR_INVALID_ARGUMENT;
    set->mask[device->gpu] |= types;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned timeout_ms) {
    CHECK_INIT();
    (void)timeout_ms;   /* the fake never blocks: what is due is there, else TIMEOUT at once */
    if (set != &event_set || !data) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < fake.xid_count; i++) {
        fake_xid *xid = &fake.xids[i];
        if (xid->delivered || xid->drain > fake.empty_waits) continue;
        if (!(set->mask[xid->gpu] & XID_CRITICAL_EVENT)) continue;
        xid->delivered = 1;
        memset(data, 0, sizeof *data);
        data->device = &fake.gpus[xid->gpu].handle;
        data->eventType = XID_CRITICAL_EVENT;
        data->eventData = xid->code;
        data->gpuInstanceId = xid->gpu_instance;
        data->computeInstanceId = NO_INSTANCE;
        return NVML_SUCCESS;
    }
    fake.empty_waits++;
    return NVML_ERROR_TIMEOUT;
}
