/* ops_program.h: the opcodes of fuzz_ops.c's input programs, shared with
 * gen_seeds.c, which writes the seed corpus fuzz/corpus/ops.
 *
 * Program layout (a byte past the end reads as 0):
 *   head       bit 0: f64 (else f32); 1 + (bits 1-2 % 3) input tensors;
 *              bits 3-4: the matmul kernel path, best (0), portable (1),
 *              AVX2 (2), AVX-512 (3), as far as the CPU has it
 *   tensor     kind byte: ndim = kind % 5, NB_BOOL if (kind >> 3) % 4 == 3,
 *              requires grad if kind & 0x20; then ndim sizes (byte % 6), then
 *              one byte per element (bool: byte & 1; else fuzz_ops.c val_of)
 *   op ...     up to 24 times: opcode byte (% OP_COUNT), then its operands
 *              (pool indices, byte % pool size) and arguments, as read by the
 *              op_* function in fuzz_ops.c. Results join the pool (10 slots). */
#ifndef NABLA_FUZZ_OPS_PROGRAM_H
#define NABLA_FUZZ_OPS_PROGRAM_H

enum {
    OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_MATMUL, OP_SOFTMAX, OP_LOG_SOFTMAX, OP_MASKED_FILL,
    OP_SUM, OP_MEAN, OP_MAX, OP_SUM_ALL, OP_MEAN_ALL, OP_EXP, OP_TANH, OP_RELU, OP_NEG, OP_LOG,
    OP_SQRT, OP_GELU, OP_CONTIGUOUS, OP_CAT, OP_WHERE, OP_GT, OP_LT, OP_EQ, OP_NOT,
    OP_TRANSPOSE, OP_PERMUTE, OP_UNSQUEEZE, OP_SQUEEZE, OP_EXPAND, OP_NARROW, OP_SELECT,
    OP_VIEW, OP_RESHAPE, OP_TO, OP_POW, OP_ADD_SCALAR, OP_MUL_SCALAR, OP_ARGMAX, OP_NE,
    OP_DETACH, OP_REQUIRES_GRAD, OP_COUNT
};

#endif
