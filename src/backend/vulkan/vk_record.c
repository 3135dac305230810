/*
 * vk_record.c — the Vulkan backend's step log and its replay (vk.h,
 * docs/VULKAN.md "Record once, replay"). The ops never call vkCmd*
 * themselves: each dispatch, copy and fill of a step is appended to a log
 * (vk_log_ent: pipeline, push constants, grid, buffers, barrier). When the
 * step runs, the log becomes a command buffer:
 *
 *   - if a recording of an equal log exists (byte-equal, compared newest
 *     first over VK_REPLAY_SLOTS slots), that command buffer is submitted
 *     again: nothing is recorded;
 *   - else a new command buffer is recorded from the log and, when the step
 *     is cacheable, kept in the least recently used slot.
 *
 * Equal logs give equal command buffers, so a replay runs exactly what a
 * fresh recording would (bit-identical results). What changes from step
 * to step (token ids, RoPE cos/sin, KV slots and lengths, page tables)
 * lives in the host-visible arena at offsets that depend only on the
 * step's shape, so the log — and the recording — is per shape bucket:
 * the number of rows, and per token the page-table length rounded up to a
 * power of two (vk_ops.c). Weights, adapters or buffers that change show
 * up as different addresses in the push constants: a different log, a
 * new recording. The only handle that can be destroyed and reused while
 * recordings name it is the staging buffer, which drops them all
 * (cmf_vk_replay_drop).
 *
 * Barriers: each entry's barrier-after is decided when the next entry is
 * appended, from the device ranges the ops declared (cmf_vk_acc): only a
 * read-after-write, write-after-write or write-after-read overlap with the
 * entries since the last barrier, or an entry that declared nothing, gets
 * one (order(), below); the last entry always has one.
 *
 * Not cacheable: CMF_VK_REPLAY=0, CMF_VK_PROFILE=1 (its timestamps), a
 * step split by a mid-step read (the MoE fallback of vk_ops_moe.c), ops
 * outside a step.
 */
#include "backend/vulkan/vk.h"

#include <stdio.h>
#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double cmf_vk_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

bool cmf_vk_log_open(vk_ctx *vk) {
    vk->n_log = 0;
    vk->recording = true;
    vk->n_dispatch = 0;
    vk->n_pend = 0, vk->pend_unknown = false, vk->last_indep = false;
    vk->prev_pend = 0, vk->prev_unknown = false;
    vk->n_acc_next = 0, vk->acc_over = false;
    vk->chain_filled = false, vk->chain_nobar = false, vk->n_chain = 0, vk->chain_last = UINT32_MAX;
    return true;
}

void cmf_vk_acc(vk_ctx *vk, VkDeviceAddress a, uint64_t bytes, bool w) {
    if (!a || !bytes) return;
    if (vk->n_acc_next == VK_ACC_MAX) {
        vk->acc_over = true; /* too many to track: the dispatch counts as touching anything */
        return;
    }
    vk->acc_next[vk->n_acc_next++] = (vk_acc){a, a + bytes, w};
}

void cmf_vk_acc_alloc(vk_ctx *vk, const void *p, bool w) {
    for (uint32_t i = 0; i < vk->n_allocs; i++) {
        const vk_alloc_rec *r = &vk->allocs[i];
        if ((uintptr_t)p >= r->va && (uintptr_t)p < r->va + r->size) {
            cmf_vk_acc(vk, cmf_vk_addr(vk, (const void *)r->va), r->size, w);
            return;
        }
    }
    vk->acc_over = true; /* not an allocation: unknown */
}

/* Dependency tracking (docs/VULKAN.md "A step"): a new entry touching the
 * declared ranges acc[0..n) (n == 0: unknown, anything) gets a barrier
 * before it — set as the previous entry's barrier-after — when it reads or
 * writes a range an entry since the last barrier wrote, or writes one such
 * an entry read (read-after-write, write-after-write, write-after-read), or
 * when either side is unknown; never when the previous entry was declared
 * independent of the next (vk->no_barrier: matmul_parts, the MoE's gate/up).
 * The decision depends only on the log, so equal logs stay equal (replay). */
static bool conflict(const vk_ctx *vk, const vk_acc *acc, uint32_t n, uint32_t n_pend) {
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < n_pend; j++) {
            const vk_acc *a = &acc[i], *b = &vk->pend[j];
            if ((a->w || b->w) && a->lo < b->hi && b->lo < a->hi) return true;
        }
    return false;
}

static void order(vk_ctx *vk, const vk_acc *acc, uint32_t n, bool indep_of_next) {
    vk_log_ent *prev = vk->n_log ? &vk->log[vk->n_log - 1] : NULL;
    bool need;
    if (!vk->dep_barriers) need = !vk->last_indep;
    else if (vk->last_indep) /* independent of prev itself, not of the entries before it */
        need = vk->prev_unknown || (vk->prev_pend > 0 && (n == 0 || conflict(vk, acc, n, vk->prev_pend)));
    else need = vk->pend_unknown || n == 0 || conflict(vk, acc, n, vk->n_pend);
    if (vk->chain_nobar) { /* a chained mat-vec: it waits on prev's counter instead (vk_ops.c record_dot) */
        assert(prev && prev->kind == VK_LOG_DISPATCH && !prev->barrier);
        need = false, vk->chain_nobar = false;
    }
    if (prev && !prev->barrier && need) prev->barrier = 1;
    if (!prev || prev->barrier) vk->n_pend = 0, vk->pend_unknown = false;
    vk->prev_pend = vk->n_pend, vk->prev_unknown = vk->pend_unknown; /* what was pending before this entry */
    if (n == 0 || vk->n_pend + n > VK_PEND_MAX) {
        vk->pend_unknown = true;
    } else {
        memcpy(vk->pend + vk->n_pend, acc, n * sizeof *acc);
        vk->n_pend += n;
    }
    assert(vk->n_pend <= VK_PEND_MAX && vk->prev_pend <= vk->n_pend); /* pend holds what it counts */
    vk->last_indep = indep_of_next;
}

static vk_log_ent *log_add(vk_ctx *vk, uint32_t kind) {
    if (vk->n_log == vk->cap_log) {
        uint32_t cap = vk->cap_log ? vk->cap_log * 2 : 256;
        vk_log_ent *l = realloc(vk->log, (size_t)cap * sizeof *l);
        if (!l) {
            cmf_vk_fail(vk, CMF_ERR_NOMEM, "vulkan: out of memory for the step's command log");
            return NULL;
        }
        vk->log = l;
        vk->cap_log = cap;
    }
    vk_log_ent *e = &vk->log[vk->n_log++];
    memset(e, 0, sizeof *e);
    e->kind = kind;
    return e;
}

void cmf_vk_log_dispatch(vk_ctx *vk, VkPipeline p, vk_shader sh, const void *push, uint32_t push_size, uint32_t gx,
                         uint32_t gy, uint32_t gz, bool barrier) {
    order(vk, vk->acc_next, vk->acc_over ? 0 : vk->n_acc_next, !barrier);
    vk->n_acc_next = 0, vk->acc_over = false;
    vk_log_ent *e = log_add(vk, VK_LOG_DISPATCH);
    if (!e) return;
    e->pipe = p;
    e->sh = (uint32_t)sh;
    e->g[0] = gx, e->g[1] = gy, e->g[2] = gz;
    memcpy(e->push, push, push_size < VK_PUSH_MAX ? push_size : VK_PUSH_MAX);
    vk->n_dispatch++;
}

void cmf_vk_log_copy(vk_ctx *vk, VkBuffer src, uint64_t src_off, VkBuffer dst, uint64_t dst_off, uint64_t bytes) {
    order(vk, NULL, 0, false); /* copies and fills: unknown ranges */
    vk_log_ent *e = log_add(vk, VK_LOG_COPY);
    if (!e) return;
    e->src = src, e->src_off = src_off, e->dst = dst, e->dst_off = dst_off, e->size = bytes;
}

void cmf_vk_log_fill(vk_ctx *vk, VkBuffer dst, uint64_t off, uint64_t bytes) {
    order(vk, NULL, 0, false);
    vk_log_ent *e = log_add(vk, VK_LOG_FILL);
    if (!e) return;
    e->dst = dst, e->dst_off = off, e->size = bytes;
}

static void barrier(VkCommandBuffer cb) {
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                                           VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT |
                                           VK_ACCESS_INDIRECT_COMMAND_READ_BIT}; /* MoE: vk_ops_moe.c */
    VkPipelineStageFlags stages = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
    vkCmdPipelineBarrier(cb, stages, stages | VK_PIPELINE_STAGE_DRAW_INDIRECT_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
}

/* The profile's dispatch group of entry e (added on first sight; the last
 * group takes what does not fit). */
static uint16_t prof_group(vk_ctx *vk, const vk_log_ent *e) {
    uint32_t groups = e->g[0] * e->g[1] * e->g[2];
    for (uint32_t i = 0; i < vk->n_prof_g; i++)
        if (vk->prof_g[i].pipe == e->pipe && vk->prof_g[i].groups == groups) return (uint16_t)i;
    if (vk->n_prof_g == VK_PROF_GROUPS) return VK_PROF_GROUPS - 1;
    vk_prof_group *g = &vk->prof_g[vk->n_prof_g];
    *g = (vk_prof_group){.pipe = e->pipe, .sh = e->sh, .groups = groups};
    for (uint32_t i = 0; i < vk->n_pipes; i++)
        if (vk->pipes[i].p == e->pipe) g->wg = vk->pipes[i].spec[0], g->dt = vk->pipes[i].spec[1], g->nt = vk->pipes[i].spec[2];
    return (uint16_t)vk->n_prof_g++;
}

/* The log's commands into cb (begun with flags); profile timestamps after
 * every dispatch when CMF_VK_PROFILE is on. */
static bool record(vk_ctx *vk, VkCommandBuffer cb, VkCommandBufferUsageFlags flags) {
    double t0 = cmf_vk_now_us();
    vkResetCommandBuffer(cb, 0);
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, .flags = flags};
    if (vkBeginCommandBuffer(cb, &bi) != VK_SUCCESS) {
        cmf_vk_fail(vk, CMF_ERR_NOMEM, "vulkan: vkBeginCommandBuffer failed");
        return false;
    }
    bool prof = vk->profile;
    if (prof) {
        vkCmdResetQueryPool(cb, vk->qpool, 0, 4096);
        vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, vk->qpool, 0);
        vk->n_q = 0;
    }
    VkPipeline bound = VK_NULL_HANDLE;
    for (uint32_t i = 0; i < vk->n_log; i++) {
        const vk_log_ent *e = &vk->log[i];
        if (e->kind == VK_LOG_DISPATCH) {
            if (e->pipe != bound) vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, e->pipe);
            bound = e->pipe;
            vkCmdPushConstants(cb, vk->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, VK_PUSH_MAX, e->push);
            if (e->ib) vkCmdDispatchIndirect(cb, e->ib, e->ib_off); /* grid written by the device */
            else vkCmdDispatch(cb, e->g[0], e->g[1], e->g[2]);
        } else if (e->kind == VK_LOG_COPY) {
            VkBufferCopy r = {e->src_off, e->dst_off, e->size};
            vkCmdCopyBuffer(cb, e->src, e->dst, 1, &r);
        } else {
            vkCmdFillBuffer(cb, e->dst, e->dst_off, e->size, 0);
        }
        if (e->barrier) barrier(cb), vk->n_barriers++;
        if (prof && e->kind == VK_LOG_DISPATCH && vk->n_q + 1 < 4096) {
            vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, vk->qpool, ++vk->n_q);
            vk->q_grp[vk->n_q] = prof_group(vk, e);
        }
    }
    bool ok = vkEndCommandBuffer(cb) == VK_SUCCESS;
    if (!ok) cmf_vk_fail(vk, CMF_ERR_NOMEM, "vulkan: vkEndCommandBuffer failed");
    if (vk->step_cacheable && !vk->immediate) {
        vk->stats.us_record += cmf_vk_now_us() - t0;
        vk->stats.cmds_recorded += vk->n_log;
    }
    return ok;
}

/* The recording of an equal log, newest first; NULL when none. */
static vk_replay_slot *find(vk_ctx *vk) {
    vk_replay_slot *best = NULL;
    for (int i = 0; i < VK_REPLAY_SLOTS; i++) {
        vk_replay_slot *s = &vk->slots[i];
        if (!s->cb || s->n != vk->n_log || (best && s->last_use < best->last_use)) continue;
        if (memcmp(s->log, vk->log, (size_t)vk->n_log * sizeof *vk->log) == 0) best = s;
    }
    return best;
}

/* The least recently used slot, its command buffer allocated, the log copied in. */
static vk_replay_slot *take_slot(vk_ctx *vk) {
    vk_replay_slot *s = &vk->slots[0];
    for (int i = 1; i < VK_REPLAY_SLOTS; i++)
        if (!vk->slots[i].cb || (s->cb && vk->slots[i].last_use < s->last_use)) s = &vk->slots[i];
    if (!s->cb) {
        VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                           .commandPool = vk->cpool, .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                           .commandBufferCount = 1};
        if (vkAllocateCommandBuffers(vk->dev, &cai, &s->cb) != VK_SUCCESS) {
            s->cb = VK_NULL_HANDLE;
            return NULL;
        }
    }
    if (s->cap < vk->n_log) {
        vk_log_ent *l = realloc(s->log, (size_t)vk->n_log * sizeof *l);
        if (!l) return NULL;
        s->log = l;
        s->cap = vk->n_log;
    }
    s->n = 0; /* valid only once recorded */
    return s;
}

cmf_status cmf_vk_log_run(vk_ctx *vk) {
    vk->recording = false;
    if (vk->n_log) vk->log[vk->n_log - 1].barrier = 1; /* the step's writes before anything after it */
    double t0 = cmf_vk_now_us();
    bool cache = vk->step_cacheable && vk->replay && !vk->profile && !vk->immediate && vk->n_log > 0;
    VkCommandBuffer cb = VK_NULL_HANDLE;
    if (cache) {
        vk->stats.us_host += t0 - vk->t_begin;
        vk->stats.steps++;
        vk_replay_slot *s = find(vk);
        if (s) {
            cb = s->cb;
            s->last_use = ++vk->use_tick;
            vk->stats.replayed++;
            vk->stats.us_match += cmf_vk_now_us() - t0;
        } else if ((s = take_slot(vk)) && record(vk, s->cb, 0)) {
            memcpy(s->log, vk->log, (size_t)vk->n_log * sizeof *vk->log);
            s->n = vk->n_log;
            s->last_use = ++vk->use_tick;
            cb = s->cb;
            vk->stats.recorded++;
        } else {
            cache = false;
            vk->stats.steps--;
            vk->stats.us_host -= t0 - vk->t_begin;
        }
    }
    if (!cache) {
        if (vk->step_cacheable && !vk->immediate) {
            vk->stats.steps++;
            vk->stats.uncached++;
            vk->stats.us_host += t0 - vk->t_begin;
        }
        if (!record(vk, vk->cmd, VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT)) return vk->err_st;
        cb = vk->cmd;
    }
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &cb};
    vkResetFences(vk->dev, 1, &vk->fence);
    double t1 = cmf_vk_now_us();
    VkResult r = vkQueueSubmit(vk->queue, 1, &si, vk->fence);
    vk->n_submits++;
    if (r == VK_SUCCESS) r = vkWaitForFences(vk->dev, 1, &vk->fence, VK_TRUE, UINT64_MAX);
    if (vk->step_cacheable && !vk->immediate) vk->stats.us_wait += cmf_vk_now_us() - t1;
    vk->n_log = 0;
    vk->step_cacheable = false; /* until the next begin */
    if (r != VK_SUCCESS)
        return cmf_vk_fail(vk, r == VK_ERROR_DEVICE_LOST ? CMF_ERR_IO : CMF_ERR_NOMEM,
                           "vulkan: the step failed on %s (VkResult %d)", vk->name, (int)r);
    if (vk->chain_flag && *vk->chain_flag) { /* a chained wait gave up: its results are not to be trusted */
        *vk->chain_flag = 0;
        vk->chain = false;
        cmf_vk_replay_drop(vk); /* the recordings hold chained dispatches */
        return cmf_vk_fail(vk, CMF_ERR_IO,
                           "vulkan: a chained mat-vec on %s waited past its bound for the dispatch before it (the "
                           "device does not start dispatches in order without a barrier); chaining is now off "
                           "(CMF_VK_CHAIN=0 keeps it off)", vk->name);
    }
    if (vk->profile && vk->n_q) { /* per-shader GPU time of the finished command buffer */
        uint64_t ts[4096];
        if (vkGetQueryPoolResults(vk->dev, vk->qpool, 0, vk->n_q + 1, sizeof ts, ts, sizeof ts[0],
                                  VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) == VK_SUCCESS) {
            for (uint32_t i = 1; i <= vk->n_q; i++) {
                vk->prof_g[vk->q_grp[i]].ns += (double)(ts[i] - ts[i - 1]) * vk->ts_period;
                vk->prof_g[vk->q_grp[i]].n++;
            }
            vk->prof_steps++;
        }
        vk->n_q = 0;
    }
    return CMF_OK;
}

void cmf_vk_replay_drop(vk_ctx *vk) {
    for (int i = 0; i < VK_REPLAY_SLOTS; i++) vk->slots[i].n = 0, vk->slots[i].last_use = 0;
}

void cmf_vk_replay_free(vk_ctx *vk) {
    for (int i = 0; i < VK_REPLAY_SLOTS; i++) {
        if (vk->slots[i].cb) vkFreeCommandBuffers(vk->dev, vk->cpool, 1, &vk->slots[i].cb);
        free(vk->slots[i].log);
        memset(&vk->slots[i], 0, sizeof vk->slots[i]);
    }
    free(vk->log);
    vk->log = NULL;
    vk->n_log = vk->cap_log = 0;
}

void cmf_vk_stats(const vk_ctx *vk, vk_step_stats *out) { *out = vk->stats; }

void cmf_vk_stats_print(const vk_ctx *vk) {
    const vk_step_stats *s = &vk->stats;
    if (!s->steps) return;
    uint64_t rec = s->recorded + s->uncached;
    fprintf(stderr,
            "vulkan steps (%s): %llu (%llu replayed, %llu recorded for replay, %llu recorded once); host: ops "
            "%.1f us/step, record %.1f us/recorded step (%.1f commands), replay lookup %.2f us/replayed step; "
            "submit+wait %.1f us/step; %llu chained mat-vecs logged\n",
            vk->name, (unsigned long long)s->steps, (unsigned long long)s->replayed, (unsigned long long)s->recorded,
            (unsigned long long)s->uncached, s->us_host / (double)s->steps, rec ? s->us_record / (double)rec : 0.0,
            rec ? (double)s->cmds_recorded / (double)rec : 0.0, s->replayed ? s->us_match / (double)s->replayed : 0.0,
            s->us_wait / (double)s->steps, (unsigned long long)vk->n_chained);
}

static const char *const sh_names[VK_SH_COUNT] = {
    "matmul", "get_rows", "rmsnorm", "rope", "kv_store", "attention", "eltwise", "probe", "matmul_tiled",
    "moe_combine", "lora", "topk", "matmul_coop", "moe_route", "moe_mm", "attn_coop", "matmul_dot", "attn_dec",
    "attn_comb", "rope_kv", "matmul_bdec", "attn_dec2"};

const char *cmf_vk_shader_name(vk_shader sh) { return (unsigned)sh < VK_SH_COUNT ? sh_names[sh] : "?"; }

/* What a group's specialization constants say, for the matrix shaders: the
 * weight dtype, matmul_dot's fusion bits, the tokens a workgroup. */
static void group_desc(const vk_prof_group *g, char *out, size_t cap) {
    bool mm = g->sh == VK_SH_MATMUL || g->sh == VK_SH_MATMUL_DOT || g->sh == VK_SH_MATMUL_COOP ||
              g->sh == VK_SH_MATMUL_BDEC || g->sh == VK_SH_MATMUL_TILED;
    if (!mm) {
        snprintf(out, cap, "wg %u, spec %u/%u", g->wg, g->dt, g->nt);
        return;
    }
    uint32_t f = g->dt >> 16;
    bool dot = g->sh == VK_SH_MATMUL_DOT;
    snprintf(out, cap, "%s%s%s%s%s, %u tok/wg", cmf_dtype_name((cmf_dtype)(g->dt & 0xffffu)),
             dot && (f & 1u) ? " +norm" : "", dot && (f & 8u) ? " +glu" : "", dot && (f & 2u) ? " +add" : "",
             dot && (f & 4u) ? " chained" : "", g->nt);
}

void cmf_vk_profile_print(const vk_ctx *vk) {
    double total = 0, sh_ns[VK_SH_COUNT] = {0};
    uint64_t sh_n[VK_SH_COUNT] = {0};
    for (uint32_t i = 0; i < vk->n_prof_g; i++) {
        const vk_prof_group *g = &vk->prof_g[i];
        assert(g->sh < VK_SH_COUNT);
        total += g->ns, sh_ns[g->sh] += g->ns, sh_n[g->sh] += g->n;
    }
    fprintf(stderr, "vulkan profile (%s): %llu steps, %.3f ms of GPU time\n", vk->name,
            (unsigned long long)vk->prof_steps, total / 1e6);
    for (int i = 0; i < VK_SH_COUNT; i++)
        if (sh_n[i])
            fprintf(stderr, "  %-10s %8llu dispatches %10.3f ms %8.2f us each %5.1f%%\n", sh_names[i],
                    (unsigned long long)sh_n[i], sh_ns[i] / 1e6, sh_ns[i] / 1e3 / (double)sh_n[i],
                    100.0 * sh_ns[i] / (total > 0 ? total : 1));
    /* the groups, largest first (selection: a few dozen) */
    bool shown[VK_PROF_GROUPS] = {false};
    fprintf(stderr, "vulkan profile by dispatch group (pipeline and grid):\n");
    for (uint32_t k = 0; k < vk->n_prof_g; k++) {
        int best = -1;
        for (uint32_t i = 0; i < vk->n_prof_g; i++)
            if (!shown[i] && (best < 0 || vk->prof_g[i].ns > vk->prof_g[best].ns)) best = (int)i;
        if (best < 0 || vk->prof_g[best].n == 0) break;
        shown[best] = true;
        const vk_prof_group *g = &vk->prof_g[best];
        char d[96];
        group_desc(g, d, sizeof d);
        fprintf(stderr, "  %-10s %-34s %6u wgs %8llu dispatches %10.3f ms %8.2f us each %5.1f%%\n", sh_names[g->sh], d,
                g->groups, (unsigned long long)g->n, g->ns / 1e6, g->ns / 1e3 / (double)g->n,
                100.0 * g->ns / (total > 0 ? total : 1));
    }
}
