/*
 * cmf.h — public API of libcmf, the cmf LLM inference runtime.
 *
 *   cmf/core.h       status codes, errors, f16/bf16 conversion
 *   cmf/format.h     the CMF v2 container: open, write, verify, sign
 *   cmf/import.h     Hugging Face, GGUF and llama2.c importers
 *   cmf/tokenizer.h  Hugging Face-compatible tokenizers
 *   cmf/chat.h       Jinja chat templates
 *   cmf/device.h     devices (cpu, cpu:t=N) shared by the models on them
 *   cmf/model.h      model, KV cache, batched forward pass
 *   cmf/sample.h     samplers and stop strings
 *   cmf/generate.h   one conversation: the session run and chat use
 *   cmf/engine.h     many sequences: continuous batching on a paged KV cache
 *   cmf/lora.h       LoRA adapters: open, check, import from PEFT
 *   cmf/policy.h     a model's stop ids, BOS rule and chat prompt
 *
 * Link with `pkg-config --cflags --libs cmf` (just -lcmf; its own
 * dependencies are private). cmf_version() gives the library's version.
 */
#ifndef CMF_H
#define CMF_H

#include "cmf/core.h"
#include "cmf/format.h"
#include "cmf/import.h"
#include "cmf/tokenizer.h"
#include "cmf/chat.h"
#include "cmf/model.h"
#include "cmf/sample.h"
#include "cmf/generate.h"
#include "cmf/engine.h"
#include "cmf/lora.h"
#include "cmf/policy.h"
#include "cmf/grammar.h"
#include "cmf/skills.h"
#include "cmf/tools.h"
#include "cmf/speculate.h"

#endif /* CMF_H */
