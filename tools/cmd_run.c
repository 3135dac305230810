/* cmd_run.c — placeholder; replaced by its module's owner. */
#include "cli.h"
#include <stdio.h>
int cmd_run(int argc, char **argv) { (void)argc; fprintf(stderr, "cmf %s: not implemented yet\n", argv[0]); return CLI_EXIT_FAIL; }
int cmd_logits(int argc, char **argv) { (void)argc; fprintf(stderr, "cmf %s: not implemented yet\n", argv[0]); return CLI_EXIT_FAIL; }
int cmd_ppl(int argc, char **argv) { (void)argc; fprintf(stderr, "cmf %s: not implemented yet\n", argv[0]); return CLI_EXIT_FAIL; }
