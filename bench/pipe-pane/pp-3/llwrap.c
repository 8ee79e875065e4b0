// llwrap [-s] [-r DIR]... [-w DIR]... -- CMD ARGS
// Applies one Landlock layer (ABI from kernel, <= 6 rights used): read/exec beneath each -r,
// everything beneath each -w; -s adds scopes (signal + abstract unix, ABI 6). Then execs CMD.
#define _GNU_SOURCE
#include <linux/types.h>
/* headers on this machine predate ABI 3-6: own definitions (uapi values) */
struct ll_attr { __u64 handled_access_fs, handled_access_net, scoped; };
struct landlock_path_beneath_attr { __u64 allowed_access; __s32 parent_fd; } __attribute__((packed));
#define LANDLOCK_RULE_PATH_BENEATH 1
#define LANDLOCK_ACCESS_FS_EXECUTE (1ULL<<0)
#define LANDLOCK_ACCESS_FS_READ_FILE (1ULL<<2)
#define LANDLOCK_ACCESS_FS_READ_DIR (1ULL<<3)
#define LANDLOCK_ACCESS_FS_REFER (1ULL<<13)
#define LANDLOCK_ACCESS_FS_TRUNCATE (1ULL<<14)
#define LANDLOCK_ACCESS_FS_IOCTL_DEV (1ULL<<15)
#define LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET (1ULL<<0)
#define LANDLOCK_SCOPE_SIGNAL (1ULL<<1)
#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#define SYS_landlock_add_rule 445
#define SYS_landlock_restrict_self 446
#endif
#include <sys/syscall.h>
#include <sys/prctl.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static int add(int rs, const char *p, __u64 acc) {
  struct landlock_path_beneath_attr pb = { .allowed_access = acc };
  pb.parent_fd = open(p, O_PATH | O_CLOEXEC);
  if (pb.parent_fd < 0) { perror(p); return -1; }
  int r = syscall(SYS_landlock_add_rule, rs, LANDLOCK_RULE_PATH_BENEATH, &pb, 0);
  if (r) perror("add_rule");
  close(pb.parent_fd); return r;
}
int main(int argc, char **argv) {
  int scope = 0, i;
  __u64 fs = (LANDLOCK_ACCESS_FS_REFER << 1) - 1;            // ABI 2 fs rights
  fs |= LANDLOCK_ACCESS_FS_TRUNCATE | LANDLOCK_ACCESS_FS_IOCTL_DEV;
  __u64 ro = LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR;
  struct ll_attr a = { .handled_access_fs = fs };
  for (i = 1; i < argc && strcmp(argv[i], "--"); i++) if (!strcmp(argv[i], "-s")) scope = 1;
  if (scope) a.scoped = LANDLOCK_SCOPE_SIGNAL | LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET;
  int rs = syscall(SYS_landlock_create_ruleset, &a, sizeof a, 0);
  if (rs < 0) { perror("create_ruleset"); return 1; }
  for (i = 1; i < argc && strcmp(argv[i], "--"); i++) {
    if (!strcmp(argv[i], "-r")) add(rs, argv[++i], ro);
    else if (!strcmp(argv[i], "-w")) add(rs, argv[++i], fs & ~LANDLOCK_ACCESS_FS_REFER ? fs : fs);
  }
  prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  if (syscall(SYS_landlock_restrict_self, rs, 0)) { perror("restrict_self"); return 1; }
  execvp(argv[i + 1], argv + i + 1); perror("exec"); return 127;
}
