/*
 * vk.h — internals of the Vulkan backend (src/backend/vulkan/), shared by
 * its files: vk_device.c (instance and device selection, device memory
 * and its suballocator, the fake address space of the model's opaque
 * pointers, pipelines and the on-disk pipeline cache, staging, weight
 * upload), vk_record.c (the step's command log, recorded command buffers
 * and their replay) and vk_ops.c (the cmf_backend_ops table), with the MoE
 * block, the LoRA update and topk in vk_ops_moe.c, vk_ops_lora.c and
 * vk_ops_sample.c, and the tables some weights carry on the device in
 * vk_repack.c.
 *
 * Memory model (docs/VULKAN.md):
 *   - Device memory comes in blocks (VkBuffer + VkDeviceMemory, device-local,
 *     buffer device address); allocations are ranges of a block (first fit,
 *     256-byte aligned, coalescing free list).
 *   - Every block also owns a range of a PROT_NONE host address reservation
 *     (mmap), so the "pointers" handed to the model are unique, never
 *     collide with host memory, support pointer arithmetic, and map back to
 *     (block, offset) and to a device address: addr = block.addr + (p - block.va).
 *   - Shaders reach every buffer through device addresses in push constants
 *     (GL_EXT_buffer_reference): no descriptor sets.
 *   - Per-step host data (token ids, positions' cos/sin, page tables, KV
 *     slots, masks) is written by the ops into a host-visible arena that
 *     lives until the step's submission has completed, at offsets that
 *     depend on the step's shape only, so an equal step replays its
 *     recorded command buffer (vk_record.c).
 *   - Weights: one device copy per tensor payload, keyed by its host data
 *     pointer, uploaded at load (prepare) or on first use; small host
 *     float vectors (norm weights, biases) are uploaded on first use and
 *     matched by pointer, length and content.
 *
 * Thread-safety: a backend is used by one thread at a time (cmf/device.h).
 */
#ifndef CMF_BACKEND_VK_H
#define CMF_BACKEND_VK_H

#include "backend/backend.h"

#include <stdbool.h>
#include <stdint.h>
#include <vulkan/vulkan.h>

/* The shaders (shaders/<name>.comp), embedded as SPIR-V. */
typedef enum vk_shader {
    VK_SH_MATMUL, VK_SH_GET_ROWS, VK_SH_RMSNORM, VK_SH_ROPE, VK_SH_KV_STORE, VK_SH_ATTENTION,
    VK_SH_ELTWISE, VK_SH_PROBE, VK_SH_MATMUL_TILED, VK_SH_MOE_COMBINE, VK_SH_LORA, VK_SH_TOPK,
    VK_SH_MATMUL_COOP, /* cooperative-matrix GEMM: created only where vk_ctx.coop is set */
    VK_SH_MOE_ROUTE, VK_SH_MOE_MM,
    VK_SH_ATTENTION_COOP, /* flash attention on cooperative matrices: created only where vk_ctx.coop is set */
    VK_SH_MATMUL_DOT, /* integer-dot decode mat-vec: created only where vk_ctx.dot_ok is set */
    VK_SH_ATTN_DEC, VK_SH_ATTN_COMB, /* split-K decode attention: partials, merge (vk_ops.c) */
    VK_SH_ROPE_KV,                   /* rope + kv_store in one dispatch */
    VK_SH_MATMUL_BDEC, /* many-token decode mat-vec (matmul_bdec.comp): created only where vk_ctx.dot_ok is set */
    VK_SH_ATTN_DEC2, /* split-K pass 1, long-context variant: created only where vk_ctx.attn2 is set (default; CMF_VK_ATTN2=0 off) */
    VK_SH_COUNT
} vk_shader;

/* Element-wise ops of shaders/eltwise.comp. */
enum { VK_EW_ADD_SCALED, VK_EW_SOFTCAP, VK_EW_SCALE, VK_EW_ADD_ROWS, VK_EW_COPY, VK_EW_FILL, VK_EW_GLU,
       VK_EW_GATHER, VK_EW_GATE_ADD, VK_EW_TO_F16 };

typedef struct vk_block {
    VkBuffer buf;
    VkDeviceMemory mem;
    VkDeviceAddress addr;
    uint64_t size;
    uintptr_t va;        /* start of its host address range */
    void *map;           /* host mapping (host-visible blocks), else NULL */
    uint64_t *free_off, *free_len; /* sorted free ranges */
    uint32_t n_free, cap_free;
} vk_block;

typedef struct vk_alloc_rec {
    uintptr_t va;
    uint64_t size;
    uint32_t block;
} vk_alloc_rec;

typedef struct vk_weight {
    const void *host;   /* tensor payload in the mapping (the key) */
    uint64_t nbytes;
    uint64_t sample;    /* hash of dtype, size and the payload's first/last bytes: a
                           freed mapping reused for another tensor is re-uploaded */
    VkDeviceAddress addr;
    uintptr_t va;
} vk_weight;

typedef struct vk_vec {
    const float *host;
    size_t count;
    float *copy;        /* the content it was uploaded with */
    VkDeviceAddress addr;
} vk_vec;

typedef struct vk_pipe {
    vk_shader sh;
    uint32_t spec[3];
    VkPipeline p;
} vk_pipe;

typedef struct vk_arena_chunk {
    VkBuffer buf;
    VkDeviceMemory mem;
    VkDeviceAddress addr;
    uint8_t *map;
    uint64_t size, used;
} vk_arena_chunk;

/* One command of a step's log (vk_record.c): what the command buffer will
 * hold, so that a step whose log equals a recorded one replays that
 * command buffer. Zero-filled before use (compared with memcmp). */
#define VK_PUSH_MAX 128u
enum { VK_LOG_DISPATCH, VK_LOG_COPY, VK_LOG_FILL };
typedef struct vk_log_ent {
    uint32_t kind, barrier;      /* barrier: a global memory barrier after it */
    VkPipeline pipe;             /* dispatch */
    uint32_t g[3], sh;           /* dispatch: grid, shader (profile) */
    VkBuffer ib;                 /* indirect dispatch: the grid at ib_off of ib (else NULL) */
    uint64_t ib_off;
    VkBuffer src, dst;           /* copy: src -> dst; fill: dst */
    uint64_t src_off, dst_off, size;
    uint8_t push[VK_PUSH_MAX];   /* dispatch: the push constants */
} vk_log_ent;

/* A device range a dispatch reads or writes (declared by its op through
 * cmf_vk_acc, vk_record.c orders the log by them). */
typedef struct vk_acc {
    uint64_t lo, hi; /* device addresses [lo, hi) */
    bool w;          /* written (read-modify-write included) */
} vk_acc;
#define VK_ACC_MAX 8   /* ranges one dispatch may declare (more: unknown) */
#define VK_PEND_MAX 64 /* ranges since the last barrier (more: the next entry gets one) */

/* CMF_VK_PROFILE's dispatch groups: dispatches of one pipeline (shader and
 * specialization constants) and one grid size, so the call sites of one
 * shader (q/k/v, o, gate/up, down) come apart; their GPU time and count. */
#define VK_PROF_GROUPS 256
typedef struct vk_prof_group {
    VkPipeline pipe;
    uint32_t sh, wg, dt, nt, groups;
    double ns;
    uint64_t n;
} vk_prof_group;

/* A recorded step: its command buffer and the log it was recorded from. */
#define VK_REPLAY_SLOTS 8
typedef struct vk_replay_slot {
    VkCommandBuffer cb;
    vk_log_ent *log;
    uint32_t n, cap;
    uint64_t last_use;
} vk_replay_slot;

/* Host-side step counters (CMF_VK_STATS=1 prints them when the backend is
 * freed; cmf_vk_stats reads them). Times in microseconds of CPU wall clock. */
typedef struct vk_step_stats {
    uint64_t steps;              /* submissions of a step's command buffer (begin .. read) */
    uint64_t replayed, recorded; /* of them: an existing recording reused / a new one made */
    uint64_t uncached;           /* recorded one-time (replay off, profile, mid-step reads, ops outside a step) */
    uint64_t cmds_recorded;      /* log entries turned into commands */
    double us_record;            /* vkBegin .. vkEndCommandBuffer of the recorded (and uncached) steps */
    double us_match;             /* finding the recording of the replayed steps */
    double us_host;              /* begin .. the submission: the ops on the host (logging, arena data) */
    double us_wait;              /* submission .. fence signalled */
} vk_step_stats;

typedef struct vk_ctx {
    VkInstance inst;
    VkPhysicalDevice phys;
    VkDevice dev;
    VkQueue queue;
    uint32_t qfam;
    VkPhysicalDeviceProperties props;
    VkPhysicalDeviceMemoryProperties memprops;
    uint32_t mt_device, mt_host; /* memory type indices */
    uint64_t heap_bytes;         /* the device-local heap */
    VkCommandPool cpool;
    VkCommandBuffer cmd;
    VkFence fence;
    VkPipelineLayout layout;
    VkPipelineCache pcache;
    VkShaderModule mods[VK_SH_COUNT];
    char cache_path[1024];
    vk_pipe pipes[512];          /* one per (shader, spec constants) used */
    uint32_t n_pipes;
    uint16_t pipe_slot[1024];    /* open-addressed index of pipes: i + 1, 0 = empty (vk_device.c pipeline) */
    uint32_t subgroup;
    uint32_t n_cu; /* compute units (SMs, CUs) where VK_NV_shader_sm_builtins / VK_AMD_shader_core_properties tell; else 0 */
    bool tiled;                  /* prompt-class rows through matmul_tiled.comp (GPUs; CMF_VK_TILED=0/1) */
    bool wide;                   /* matmul.comp's 16-byte weight loads (CMF_VK_WIDE=0 turns them off, for A/B) */
    bool mv;                     /* matmul.comp's MV decode path (QUAD 3; CMF_VK_MV=0 turns it off, for A/B) */
    /* decode rows of q8_row/q4_block/q4_tiled/q4tp through matmul_dot.comp (int8 X, OpSDot): dot_ok where
     * the device has shaderIntegerDotProduct and subgroup shuffles (the shader is created); dot where it is
     * used: by default where 4x8-bit packed signed dot products are accelerated, CMF_VK_DOT=0/1 overrides
     * (1: also where they are not, e.g. lavapipe; tests flip it) */
    bool dot_ok, dot;
    /* decode rows beyond 8 a product through matmul_bdec.comp (32 tokens a weight read, the arithmetic of
     * matmul_dot.comp a token) where dot is used; CMF_VK_BDEC=1 turns it on (default off: slower than the cooperative-matrix GEMM on the H200) */
    bool bdec;
    /* with bdec, products of rows without row classes (n_dec < 0: the engine's non-exact mode) of at most
     * bdec_max rows (CMF_VK_BDEC_MAX, default 64) run as decode rows too (matmul_bdec.comp instead of the
     * 128-row cooperative-matrix GEMM tile, of which a batch of 16 decodes fills an eighth), and attention
     * rows that are alone in their sequence take split-K */
    uint32_t bdec_max;
    /* matmul_dot.comp: rows a subgroup takes one after another, the next row's weight loads in flight
     * during this row's sums (K staged once: cols <= 16384 at one token; CMF_VK_DOT_R, 0: vk_ops.c's
     * choice from n_cu; vk_bench sweeps it) */
    uint32_t dot_r;
    uint32_t mv_team, mv_rb, mv_wg; /* MV: subgroups a team, rows a team, subgroups a workgroup (0: vk_ops.c's
                                       choice; vk_bench and test_vk_ops sweep them) */
    /* prompt-class rows through matmul_coop.comp (tensor cores): 1 with
     * VK_KHR_cooperative_matrix, 2 with VK_NV_cooperative_matrix, 0 where
     * neither offers a 16x8x16 f16 -> f32 subgroup shape on subgroups of 32
     * (then matmul_tiled.comp); CMF_VK_COOP=0/khr/nv overrides */
    uint8_t coop;
    bool coop_xh;     /* prompt-class X converted to f16 once for matmul_coop.comp (CMF_VK_COOP_XH=0 off) */
    uint32_t coop_bm; /* matmul_coop.comp's tokens a workgroup, 32/64/128 (CMF_VK_COOP_BM; 0: by the row count) */
    /* attention's prompt-class rows through attention_coop.comp (vk_ops_fa.c):
     * where vk->coop and the shared memory it needs; CMF_VK_FA=0 turns it off
     * (A/B). n_fa_rows counts the rows it took (tests). */
    bool fa;
    uint64_t n_fa_rows;
    bool no_mid_read;            /* CMF_VK_NO_MID_READ=1: cmf_vk_read_mid fails (tests: MoE stays on the device) */
    uint64_t n_submits;          /* queue submissions so far (tests count them per step) */
    uint64_t n_mid_reads;        /* reads in the middle of a step so far */
    void *moe_ws;                /* vk_ops_moe.c: scratch of the device-routed MoE (grown on demand) */
    uint64_t moe_ws_bytes;
    bool splitk;                 /* decode-class attention rows through attention_dec.comp (CMF_VK_SPLITK=0: off) */
    bool fuse;                   /* rope_kv_store as one dispatch (CMF_VK_FUSE=0: rope, rope, kv_store) */
    uint32_t att_chunk;          /* keys a split-K workgroup (0: vk_ops.c's choice; tests set small ones) */
    bool attn2;                  /* split-K pass 1 through attention_dec2.comp (default where the device has shuffles; CMF_VK_ATTN2=0 off) */
    uint32_t attn2_nc;           /* its chunks a token at most before a chunk doubles (CMF_VK_ATTN2_NC; 0: default) */
    void *xh_ws;                 /* matmul_coop.comp's f16 copy of X (grown on demand) */
    uint64_t xh_ws_bytes;
    void *att_ws;                /* split-K partials (grown on demand) */
    uint64_t att_ws_bytes;
    bool attn_merge;             /* attention_dec2.comp merges in its last workgroups (CMF_VK_ATTN_MERGE=0: attention_comb.comp) */
    void *att_cnt;               /* its counters, zero between dispatches (vk_ops.c attn_counters) */
    uint64_t att_cnt_bytes;
    /* the step's last RoPE cos/sin table in the arena (vk_ops.c rope_cs): every layer of a step rotates
     * the same positions, so the table is computed once a step, not once a layer (64 rows x 64 angles x
     * 32 layers of cosf/sinf is milliseconds of host time a step); rcs_addr = 0 (none) after arena_reset */
    VkDeviceAddress rcs_addr;
    const float *rcs_freq;
    float rcs_factor;
    uint32_t rcs_n, rcs_half, rcs_cap;
    int32_t *rcs_pos; /* its positions [rcs_n] (capacity rcs_cap) */

    /* address space */
    uint8_t *va_base;
    uint64_t va_size, va_used;
    vk_block *blocks;
    uint32_t n_blocks, cap_blocks;
    vk_alloc_rec *allocs;
    uint32_t n_allocs, cap_allocs;

    /* host-visible memory */
    vk_arena_chunk *arena;
    uint32_t n_arena, cap_arena;
    VkBuffer stage_buf;
    VkDeviceMemory stage_mem;
    uint8_t *stage_map;
    uint64_t stage_size;

    /* weights and small vectors */
    vk_weight *weights;          /* open addressing, cap a power of two */
    uint32_t n_weights, cap_weights;
    vk_vec *vecs;
    uint32_t n_vecs, cap_vecs;

    /* the step */
    bool recording, immediate;
    bool pending;                /* submitted by the model, not yet run: the next read adds its
                                    copy and runs it (one queue submission a step); any other
                                    op, begin or free runs it first */
    bool no_barrier;             /* the next dispatch is independent of the one after it */
    /* chained mat-vecs (vk_ops.c record_dot, docs/VULKAN.md "Pipelined
     * rows, the GLU in the down product, chained mat-vecs"): a fused integer-dot mat-vec logged right after another
     * waits on that one's counter (its workgroups add 1 each when done)
     * instead of a pipeline barrier, its first weight loads issued before
     * the wait. chain_cnt: VK_CHAIN_MAX counters (device-local), zeroed by
     * a fill logged before a step's first chained dispatch; chain_flag: a
     * host-visible word a wait that gave up sets (the step then fails and
     * chaining stays off). CMF_VK_CHAIN=1 turns it on (default off: not
     * yet measured on the H200). */
    bool chain, chain_filled, chain_nobar;
    VkBuffer chain_buf, chain_fbuf;
    VkDeviceMemory chain_mem, chain_fmem;
    VkDeviceAddress chain_cnt, chain_flag_addr;
    volatile uint32_t *chain_flag;
    uint32_t n_chain;            /* counters taken in this step's log */
    uint32_t chain_last;         /* the counter the last logged entry signals (UINT32_MAX: none) */
    uint32_t chain_last_wg;      /* its workgroups */
    uint32_t chain_last_log;     /* its log index */
    uint64_t n_chained;          /* dispatches logged waiting on a counter, not a barrier (tests) */
    uint32_t n_dispatch;         /* dispatches recorded in this step */
    cmf_status err_st;           /* first error of the recorded work */
    char err_msg[256];
    char name[256];

    /* the step's log and its recordings (vk_record.c) */
    vk_log_ent *log;
    uint32_t n_log, cap_log;
    /* dependency tracking (vk_record.c): the ranges the next dispatch
     * declared, those touched since the last barrier, and whether one of
     * those entries declared none (then it may touch anything) */
    vk_acc acc_next[VK_ACC_MAX];
    uint32_t n_acc_next;
    bool acc_over;
    vk_acc pend[VK_PEND_MAX];
    uint32_t n_pend;
    bool pend_unknown, last_indep;
    uint32_t prev_pend;          /* pend[0 .. prev_pend): the ranges before the last entry's */
    bool prev_unknown;
    bool dep_barriers;           /* barriers only between dependent entries (CMF_VK_DEPS=0: after every one) */
    uint64_t n_barriers;         /* barriers recorded so far (tests) */
    bool replay;                 /* CMF_VK_REPLAY=0 turns it off (A/B) */
    bool step_cacheable;         /* this step may be replayed / recorded for replay */
    vk_replay_slot slots[VK_REPLAY_SLOTS];
    uint64_t use_tick;
    double t_begin;              /* monotonic µs at begin */
    vk_step_stats stats;
    bool print_stats;
    bool pipe_stats; /* CMF_VK_PIPE_STATS: print each pipeline's driver statistics as it is created */

    /* CMF_VK_PROFILE=1: a timestamp after every dispatch of the step's
     * command buffer; GPU time per shader, printed when the backend is freed */
    bool profile;
    VkQueryPool qpool;
    uint32_t n_q;
    uint16_t q_grp[4096];        /* the dispatch group of each timestamp's dispatch */
    vk_prof_group prof_g[VK_PROF_GROUPS];
    uint32_t n_prof_g;
    uint64_t prof_steps;
    float ts_period;             /* ns per timestamp tick */
} vk_ctx;

/* vk_record.c: the step's command log. cmf_vk_log_open starts an empty
 * log (recording = true); the cmf_vk_log_* calls append to it;
 * cmf_vk_log_run turns it into a command buffer — the recording of an
 * equal log when one exists (replay), else a new one (kept for replay when
 * the step is cacheable) — submits it and waits. cmf_vk_replay_drop forgets
 * every recording (a buffer they name was destroyed). */
bool cmf_vk_log_open(vk_ctx *vk);
void cmf_vk_log_dispatch(vk_ctx *vk, VkPipeline p, vk_shader sh, const void *push, uint32_t push_size, uint32_t gx,
                         uint32_t gy, uint32_t gz, bool barrier);
/* The next dispatch reads (w false) or writes [a, a + bytes): every device
 * range it touches that another dispatch of the step may write or read,
 * or none at all (then it is ordered after and before everything). */
void cmf_vk_acc(vk_ctx *vk, VkDeviceAddress a, uint64_t bytes, bool w);
/* The whole allocation holding backend pointer p as a declared range. */
void cmf_vk_acc_alloc(vk_ctx *vk, const void *p, bool w);
void cmf_vk_log_copy(vk_ctx *vk, VkBuffer src, uint64_t src_off, VkBuffer dst, uint64_t dst_off, uint64_t bytes);
void cmf_vk_log_fill(vk_ctx *vk, VkBuffer dst, uint64_t off, uint64_t bytes);
#define VK_CHAIN_MAX 1024 /* chained dispatches a step at most (the rest take barriers) */
/* The chain's buffers (vk->chain_buf, chain_fbuf), made once; false (chaining off) when they cannot be. */
bool cmf_vk_chain_buffers(vk_ctx *vk);
cmf_status cmf_vk_log_run(vk_ctx *vk);
void cmf_vk_replay_drop(vk_ctx *vk);
void cmf_vk_replay_free(vk_ctx *vk);
double cmf_vk_now_us(void);
/* The step counters so far (vk_step_stats). */
void cmf_vk_stats(const vk_ctx *vk, vk_step_stats *out);
void cmf_vk_stats_print(const vk_ctx *vk);
/* CMF_VK_PROFILE's table on stderr: GPU time per shader, then per dispatch group (vk_prof_group). */
void cmf_vk_profile_print(const vk_ctx *vk);

/* vk_device.c */
cmf_status cmf_vk_ctx_new(int index, vk_ctx **out, cmf_error *err);
void cmf_vk_ctx_free(vk_ctx *vk);
/* Sticky error of the step (the first one wins); returns st. */
cmf_status cmf_vk_fail(vk_ctx *vk, cmf_status st, const char *fmt, ...);
/* Device buffer of bytes (zeroed when zero); a host-range pointer, NULL on OOM. */
void *cmf_vk_alloc(vk_ctx *vk, uint64_t bytes, bool zero);
void cmf_vk_free(vk_ctx *vk, void *p);
/* A device scratch *ws of *have bytes grown to at least need (the old one
 * freed: every dispatch that used it is ordered before the next writer by
 * the dependency tracking). false, with the context's sticky error set
 * naming what, when device memory is short. */
bool cmf_vk_ws_grow(vk_ctx *vk, void **ws, uint64_t *have, uint64_t need, const char *what);
/* The block and byte offset of a pointer inside an allocation; false for
 * host memory. */
bool cmf_vk_lookup(const vk_ctx *vk, const void *p, uint32_t *block, uint64_t *off);
/* Device address of a backend pointer, or 0 for host memory. */
VkDeviceAddress cmf_vk_addr(const vk_ctx *vk, const void *p);
/* Host bytes into the step's arena: returns the host copy's device address
 * (0 and a sticky error when out of memory). */
VkDeviceAddress cmf_vk_arena_put(vk_ctx *vk, const void *data, uint64_t bytes);
/* Room for bytes in the arena: host pointer and its device address. */
void *cmf_vk_arena_get(vk_ctx *vk, uint64_t bytes, VkDeviceAddress *addr);
/* Recording: ensure a command buffer is open (an op outside begin/submit
 * runs immediately: opened here, flushed by cmf_vk_op_end). */
bool cmf_vk_op_begin(vk_ctx *vk);
void cmf_vk_op_end(vk_ctx *vk);
void cmf_vk_begin(vk_ctx *vk);
cmf_status cmf_vk_submit(vk_ctx *vk, cmf_error *err);
/* The shader's short name (profiles, CMF_VK_PIPE_STATS); "?" past the table. vk_record.c. */
const char *cmf_vk_shader_name(vk_shader sh);
/* One dispatch of shader sh (spec constants 0 WG, 1 DT = dt & 0xffff,
 * 2 NT, 3 = dt >> 16) with push data, followed by a barrier for the next
 * dispatch (unless vk->no_barrier was set: the caller's next dispatch
 * neither reads nor writes what this one writes). */
void cmf_vk_dispatch(vk_ctx *vk, vk_shader sh, uint32_t wg, uint32_t dt, uint32_t nt, const void *push,
                     uint32_t push_size, uint32_t gx, uint32_t gy, uint32_t gz);
/* A dispatch whose workgroup counts (3 × uint32) are read by the device
 * from `args` (a backend buffer, 4-byte aligned) when it runs: counts
 * written by an earlier dispatch of the step (the MoE routing). */
void cmf_vk_dispatch_indirect(vk_ctx *vk, vk_shader sh, uint32_t wg, uint32_t dt, uint32_t nt, const void *push,
                              uint32_t push_size, const void *args);
/* Copy between backend buffers / host inside the recording. */
void cmf_vk_copy_dev(vk_ctx *vk, const void *dst, const void *src, uint64_t bytes);
void cmf_vk_write_rec(vk_ctx *vk, void *dst, const void *src, uint64_t bytes);
/* Device -> host in the middle of an op that continues recording (the
 * MoE routing reads the router's scores): runs what the open command
 * buffer holds so far, reads, and opens it again for the rest of the step
 * (or of the immediate op). Errors: the step's recorded error, those of
 * cmf_vk_read. */
cmf_status cmf_vk_read_mid(vk_ctx *vk, void *dst, const void *src, uint64_t bytes, cmf_error *err);
/* Device -> host, synchronously (flushes the recording first). */
cmf_status cmf_vk_read(vk_ctx *vk, void *dst, const void *src, uint64_t bytes, cmf_error *err);
/* Device copy of a weight payload (uploaded now if absent). Errors:
 * CMF_ERR_UNSUPPORTED (dtype, size), CMF_ERR_NOMEM. */
cmf_status cmf_vk_weight(vk_ctx *vk, const cmf_tensor *t, VkDeviceAddress *out, cmf_error *err);
/* Device copy of a small host float vector (see the file comment). */
VkDeviceAddress cmf_vk_vec(vk_ctx *vk, const float *host, size_t count);
/* Whether the backend runs this dtype (and its name list for errors). */
bool cmf_vk_dtype_ok(cmf_dtype dt);
/* Upload the tensors of a file that layers [0, n_dev) of n_layer need
 * (every tensor when n_dev >= n_layer; else neither the later layers nor
 * lm_head.weight) with a progress bar; error when they do not fit, with
 * the number of layers that would (the --gpu-layers to use). */
cmf_status cmf_vk_prepare(vk_ctx *vk, const cmf_file *f, uint32_t n_layer, uint32_t n_dev, cmf_error *err);

/* vk_ops_sample.c: the op `topk` (backend.h), k <= CMF_VK_TOPK_MAX. */
#define CMF_VK_TOPK_MAX 64u
void cmf_vk_op_topk(cmf_backend *b, const float *logits, size_t ld, uint32_t n, uint32_t n_cand, uint32_t k,
                    float *out);

/* vk_repack.c: the device layout of a weight whose CMF layout the shaders
 * cannot read in place (docs/VULKAN.md, weights): `pre` bytes of tables
 * before the payload, `post` bytes after it (at a 4-byte-aligned offset);
 * both 0 for the dtypes read as stored. q4tp, q2tp: post = rows × 32 f32
 * ladder rungs; vbit, vbit_ro: pre = rows × u32 byte offsets of the packed
 * rows from the start of the device copy. */
void cmf_vk_repack_size(const cmf_tensor *t, uint64_t *pre, uint64_t *post);
/* The tables (pre bytes then post bytes, malloc'd into *out). Errors:
 * CMF_ERR_FORMAT (a vbit row of other than 3..8 bits, row offsets that do
 * not match the rows, a payload of the wrong size; naming the tensor),
 * CMF_ERR_NOMEM. */
cmf_status cmf_vk_repack(const cmf_tensor *t, void **out, cmf_error *err);

/* vk_ops_fa.c: records attention_coop.comp over the prompt-class rows
 * [t_first, n_tok) of `a` when vk->fa and their layout allows it (f16 KV,
 * head_dim % 16 == 0 and <= 128, 16-byte aligned rows), tiles of at most
 * 64 consecutive rows of one page table. rec: the per-token records
 * (vk_ops.c, 12 uints each) at device address ta; q, out: the resolved
 * buffers. Returns the first row it took (a->n_tok: none), so rows before
 * it are left to the caller. followed: the caller records a dispatch of
 * other rows of out right after this one, so no barrier goes between
 * them (the dispatch declares no ranges: a barrier goes before it). */
uint32_t cmf_vk_fa_prompt(vk_ctx *vk, const cmf_attn_args *a, uint32_t t_first, bool followed, const uint32_t *rec,
                          VkDeviceAddress ta, VkDeviceAddress q, VkDeviceAddress out);

/* vk_ops_moe.c, vk_ops_lora.c: the ops `moe` and `lora` (backend.h). */
cmf_status cmf_vk_op_moe(cmf_backend *b, const cmf_moe_args *a, cmf_error *err);
cmf_status cmf_vk_op_lora(cmf_backend *b, const cmf_lora_seg *segs, uint32_t n_segs, const float *X, uint32_t in,
                          float *Y, size_t ldy, uint32_t n_out, cmf_error *err);

#endif /* CMF_BACKEND_VK_H */
