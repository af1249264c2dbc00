/* Provenance: copied unchanged (but for this comment) from the program that measured the NVML
   memory floor of the real H100 in BENCHMARKS.md on 2026-11-22. Built and run by
   real-check.sh (gcc -O2 -o nvml_min nvml_min.c -ldl); it only reads. */
/* The smallest useful NVML exporter loop: load NVML, read four fields of every GPU once a second.
   Its resident memory is the floor for any agent that uses NVML. usage: nvml_min SECONDS */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
typedef void *dev_t_;
typedef struct { unsigned int gpu, memory; } util_t;
typedef struct { unsigned long long total, free, used; } mem_t;
int main(int argc, char **argv) {
  int secs = argc > 1 ? atoi(argv[1]) : 5;
  void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
  int (*init)(void) = dlsym(h, "nvmlInit_v2");
  int (*count)(unsigned *) = dlsym(h, "nvmlDeviceGetCount_v2");
  int (*byidx)(unsigned, dev_t_ *) = dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
  int (*util)(dev_t_, util_t *) = dlsym(h, "nvmlDeviceGetUtilizationRates");
  int (*mem)(dev_t_, mem_t *) = dlsym(h, "nvmlDeviceGetMemoryInfo");
  int (*temp)(dev_t_, int, unsigned *) = dlsym(h, "nvmlDeviceGetTemperature");
  int (*power)(dev_t_, unsigned *) = dlsym(h, "nvmlDeviceGetPowerUsage");
  if (init()) return 2;
  unsigned n = 0; count(&n);
  for (int s = 0; s < secs; s++) {
    for (unsigned i = 0; i < n; i++) {
      dev_t_ d; util_t u; mem_t m; unsigned t, p;
      byidx(i, &d); util(d, &u); mem(d, &m); temp(d, 0, &t); power(d, &p);
      if (s == secs - 1) printf("gpu %u util %u mem %llu temp %u power %u\n", i, u.gpu, m.used, t, p);
    }
    sleep(1);
  }
  char line[256]; FILE *f = fopen("/proc/self/status", "r");
  while (fgets(line, sizeof line, f)) if (!strncmp(line, "VmRSS", 5) || !strncmp(line, "VmHWM", 5)) fputs(line, stdout);
  return 0;
}
