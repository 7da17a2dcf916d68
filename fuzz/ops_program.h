/* ops_program.h: the opcodes of fuzz_ops.c's input programs, shared with
 * gen_seeds.c, which writes the seed corpus fuzz/corpus/ops, and replay.c.
 *
 * The opcodes are ops/registry.h's ops in its order (OP_<name> runs
 * nb_<name>), then the fuzzer's own: nb_detach, nb_set_requires_grad and
 * nb_autocast_begin/end.
 * Adding an op to the registry renumbers the opcodes after it, so the seed
 * corpus's programs change meaning: regenerate it (make fuzz-seeds), which
 * also gives the new op its seed (make test's replay fails without one).
 *
 * Program layout (a byte past the end reads as 0):
 *   head       bit 0: f64 (else f32); 1 + (bits 1-2 % 3) input tensors;
 *              bits 3-4: the matmul kernel path, best (0), portable (1),
 *              AVX2 (2), AVX-512 (3), as far as the CPU has it (for bf16
 *              products: vdpbf16ps where the CPU has it, then the f32-FMA
 *              fallbacks); bit 5: the first input is bf16 (if floating),
 *              bit 6: the others are
 *   tensor     kind byte: ndim = kind % 5, NB_BOOL if (kind >> 3) % 4 == 3,
 *              requires grad if kind & 0x20; then ndim sizes (byte % 6), then
 *              one byte per element (bool: byte & 1; else fuzz_ops.c val_of,
 *              rounded to the dtype)
 *   op ...     up to 24 times: opcode byte (% OP_COUNT), then its operands
 *              (pool indices, byte % pool size) and arguments, as read by the
 *              op_<name> function in fuzz_ops.c. Results join the pool (10
 *              slots). nb_gather and nb_index_select make their index tensor
 *              from the program's bytes (or take one from the pool). nb_to's
 *              dtype byte: bf16 if (byte & 0x0c) == 0x0c, else byte % 4. */
#ifndef NABLA_FUZZ_OPS_PROGRAM_H
#define NABLA_FUZZ_OPS_PROGRAM_H

#include <stddef.h>
#include <stdint.h>

#include "../ops/registry.h"

enum {
#define X(name, inputs, flags, call) OP_##name,
    NB_OPS(X)
#undef X
    OP_REGISTERED, /* the registry's ops are the opcodes below this */
    OP_detach = OP_REGISTERED,
    OP_requires_grad,
    OP_autocast, /* a byte % 4: begin(NB_BF16), begin(NB_F32), end, begin(a bad dtype) */
    OP_COUNT
};

/* fuzz_ops.c's entry points (libFuzzer's) and its per-opcode counters, for
 * replay.c and gen_seeds.c, which link it without libFuzzer. */
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* Calls of opcode op that were valid and whose result passed every check. */
long fuzz_ops_succeeded(unsigned op);
/* Calls of opcode op with a bf16 operand or result that passed: a result
 * checked (ops flagged NB_OP_BF16), or a refusal saying "bf16" of a call valid
 * but for bf16 (the others). */
long fuzz_ops_bf16(unsigned op);
/* "nb_<name>" of opcode op (NULL past OP_COUNT). */
const char *fuzz_ops_name(unsigned op);
/* How many ops the last input ran (its opcodes read). */
int fuzz_ops_last_ops(void);

#endif
