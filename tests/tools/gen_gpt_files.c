/* gen_gpt_files.c: writes the generated GPT-2 files of tests/gpt_files.h.
 *
 *   gen_gpt_files CONFIG DIR      (CONFIG: small or gpt2)
 *
 * writes DIR/CONFIG_llmc.bin (llm.c checkpoint), DIR/CONFIG_hf.safetensors
 * (Hugging Face model.safetensors) and DIR/CONFIG_tokens.bin (llm.c token
 * file). No nabla inside: the files are the loaders' independent test input. */
#include <stdio.h>

#include "../gpt_files.h"

int main(int argc, char **argv) {
    const gf_config *c = argc == 3 ? gf_config_named(argv[1]) : NULL;
    if (!c) {
        fprintf(stderr, "usage: %s small|gpt2 DIR\n", argv[0]);
        return 2;
    }
    char path[3][4096];
    snprintf(path[0], sizeof path[0], "%s/%s_llmc.bin", argv[2], c->name);
    snprintf(path[1], sizeof path[1], "%s/%s_hf.safetensors", argv[2], c->name);
    snprintf(path[2], sizeof path[2], "%s/%s_tokens.bin", argv[2], c->name);
    if (gf_write_llmc(c, path[0]) || gf_write_hf(c, path[1]) || gf_write_tokens(c, path[2]))
        return 1;
    for (int k = 0; k < 3; k++) printf("gen_gpt_files: wrote %s\n", path[k]);
    return 0;
}
