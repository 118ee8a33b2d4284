/* A SIGSEGV and SIGBUS handler, preloaded, that prints the faulting thread's name and its stack
 * (each frame's library and offset) before the fault ends the process as it would have.
 * It named the door's release thread in the faults of benches/results/h10080gbhbm3/
 * door-destroy-fault.txt. Build and use:
 *   cc -shared -fPIC -O1 -o /tmp/fault_thread.so benches/probes/fault_thread.c -ldl
 *   LD_PRELOAD=/tmp/fault_thread.so python3 -m geforce_p2p.nccl -- ...
 * Diagnostic only: what it calls is not async-signal-safe, which a process already faulting
 * can afford. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
static void on_segv(int sig, siginfo_t *si, void *uc) {
  (void)uc;
  char name[32] = "?";
  pthread_getname_np(pthread_self(), name, sizeof name);
  fprintf(stderr, "FAULT pid %d tid %ld thread '%s' signal %d addr %p\n", getpid(), (long)syscall(SYS_gettid), name, sig, si->si_addr);
  void *frames[40];
  int n = backtrace(frames, 40);
  for (int i = 0; i < n; i++) {
    Dl_info info;
    if (dladdr(frames[i], &info) && info.dli_fname)
      fprintf(stderr, "FAULT   #%d %s+0x%lx (%s)\n", i, info.dli_fname, (unsigned long)((char *)frames[i] - (char *)info.dli_fbase), info.dli_sname ? info.dli_sname : "-");
    else
      fprintf(stderr, "FAULT   #%d %p\n", i, frames[i]);
  }
  fflush(stderr);
  signal(sig, SIG_DFL);
  raise(sig);
}
__attribute__((constructor)) static void install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &sa, NULL);
  sigaction(SIGBUS, &sa, NULL);
}
