/*
 * cli/commands.h: subcommands of the `flexjit` command implemented outside
 * cli/main.c, which dispatches to them. Each takes the arguments after
 * `flexjit` (argv[0] is the subcommand's name), prints its own --help, and
 * returns the exit status (0 success, 1 failure, 2 usage error).
 */
#ifndef CLI_COMMANDS_H
#define CLI_COMMANDS_H

/* flexjit cache ls | stats | verify | prune --max-bytes N | clear
 * [--dir DIR] (cli/cmd_cache.c) */
int fj_cli_cache(int argc, char **argv);

/* flexjit precompile MANIFEST.lua --out DIR|FILE.fjpack [-j N]
 * (cli/cmd_precompile.c) */
int fj_cli_precompile(int argc, char **argv);

/* flexjit mask SPEC.lua --q-len N [--kv-len M] [--block K] [--param ...]
 * [--buffer ...] [--svg FILE] (cli/cmd_mask.c) */
int fj_cli_mask(int argc, char **argv);

#endif /* CLI_COMMANDS_H */
