// sockcat PATH: copy stdin to a connected unix stream socket (the pipe-pane command of config D)
#include <sys/socket.h>
#include <sys/un.h>
#include <string.h>
#include <unistd.h>
int main(int c, char **v) {
  int s = socket(AF_UNIX, SOCK_STREAM, 0); struct sockaddr_un a = { .sun_family = AF_UNIX };
  strncpy(a.sun_path, v[1], sizeof a.sun_path - 1);
  if (connect(s, (void *)&a, sizeof a)) return 1;
  char b[65536]; ssize_t n;
  while ((n = read(0, b, sizeof b)) > 0) for (ssize_t o = 0; o < n; ) { ssize_t w = write(s, b + o, n - o); if (w <= 0) return 1; o += w; }
  return 0;
}
