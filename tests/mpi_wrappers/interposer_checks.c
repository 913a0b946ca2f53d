/* An unmodified MPI program (knows nothing of thc) that checks where the PMPI interposer must
 * behave like MPI_Allreduce itself. One check per run, named by argv[1]:
 *   errhandler  the ranks disagree on the configuration (run with different THC_BITS): the
 *               failure reaches the communicator's error handler, once, with the returned code
 *   nonfinite   NaN and Inf in the input propagate element by element as in MPI's own sum
 *   threads     MPI_THREAD_MULTIPLE, collectives on two communicators from two threads started
 *               in opposite orders on neighbouring ranks: no deadlock (a watchdog fails the run)
 *   commfree    a freed communicator's error-feedback residual does not leak into a new
 *               communicator (Open MPI hands out the freed handle again)
 *   nonfinite16 as nonfinite for THC_MPI_FLOAT16 and THC_MPI_BFLOAT16 (looked up in the preloaded
 *               library: this program is not linked with thc), where MPI's own MPI_SUM does not
 *               know the byte-based types; also a call below THC_MIN_BYTES (passed to MPI)
 * Exit status: 0 pass, 1 fail, 77 skipped (MPI_THREAD_MULTIPLE not provided). */
#include <dlfcn.h>
#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { kBig = 1 << 17 };  /* float elements: 512 KB, above THC_MIN_BYTES */

static int rank_, size_;

static float frand(unsigned* s) {
  *s = *s * 1103515245u + 12345u;
  return (float)((*s >> 8) & 0xFFFF) / 65536.0f - 0.5f;
}

static double nmse_vs_exact(const float* x, const float* y, int n, MPI_Comm comm) {
  double* d = malloc(sizeof(double) * n);
  double* e = malloc(sizeof(double) * n);
  for (int i = 0; i < n; ++i) d[i] = x[i];
  MPI_Allreduce(d, e, n, MPI_DOUBLE, MPI_SUM, comm);
  double err = 0, ref = 0;
  for (int i = 0; i < n; ++i) {
    err += (y[i] - e[i]) * (y[i] - e[i]);
    ref += e[i] * e[i];
  }
  free(d);
  free(e);
  return ref > 0 ? err / ref : err;
}

static int g_handler_calls, g_handler_code;
static void count_errors(MPI_Comm* comm, int* code, ...) {
  (void)comm;
  g_handler_calls++;
  g_handler_code = *code;
}

static int check_errhandler(void) {
  MPI_Errhandler eh;
  MPI_Comm_create_errhandler(count_errors, &eh);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, eh);
  float* x = malloc(sizeof(float) * kBig);
  float* y = malloc(sizeof(float) * kBig);
  unsigned s = 7 + rank_;
  for (int i = 0; i < kBig; ++i) x[i] = frand(&s);
  const int rc = MPI_Allreduce(x, y, kBig, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  char text[MPI_MAX_ERROR_STRING] = "";
  int len = 0, cls = -1;
  if (rc != MPI_SUCCESS) {
    MPI_Error_string(rc, text, &len);
    MPI_Error_class(rc, &cls);
  }
  const int ok = rc != MPI_SUCCESS && g_handler_calls == 1 && g_handler_code == rc && cls != MPI_SUCCESS &&
                 strstr(text, "thc") != NULL;
  printf("rank %d: rc=%d handler_calls=%d handler_code=%d class=%d \"%s\" -> %s\n", rank_, rc, g_handler_calls,
         g_handler_code, cls, text, ok ? "ok" : "WRONG");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  MPI_Errhandler_free(&eh);
  free(x);
  free(y);
  return ok;
}

static int check_nonfinite(void) {
  float* x = malloc(sizeof(float) * kBig);
  float* y = malloc(sizeof(float) * kBig);
  unsigned s = 11 + rank_;
  for (int i = 0; i < kBig; ++i) x[i] = frand(&s);
  if (rank_ == 0) {
    x[10] = NAN;
    x[20] = INFINITY;
  }
  if (rank_ == size_ - 1) {
    x[20] = size_ > 1 ? -INFINITY : NAN; /* +Inf + -Inf = NaN */
    x[30] = INFINITY;
  }
  int ok = MPI_Allreduce(x, y, kBig, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS;
  ok = ok && isnan(y[10]) && isnan(y[20]) && isinf(y[30]) && y[30] > 0;
  /* Elsewhere exactly MPI's sum (its order of additions aside): NaN and Inf stay where they are. */
  float* xf = malloc(sizeof(float) * kBig);
  memcpy(xf, x, sizeof(float) * kBig);
  xf[10] = xf[20] = xf[30] = 0;
  float* yf = malloc(sizeof(float) * kBig);
  memcpy(yf, y, sizeof(float) * kBig);
  yf[10] = yf[20] = yf[30] = 0;
  int finite = 1;
  for (int i = 0; i < kBig; ++i)
    if (!isfinite(yf[i])) finite = 0;
  const double e1 = nmse_vs_exact(xf, yf, kBig, MPI_COMM_WORLD);
  ok = ok && finite && e1 < 1e-10;
  /* The next finite call is compressed again (approximate, not exact). */
  const int rc2 = MPI_Allreduce(xf, yf, kBig, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  const double e2 = nmse_vs_exact(xf, yf, kBig, MPI_COMM_WORLD);
  ok = ok && rc2 == MPI_SUCCESS && e2 > 1e-8 && e2 < 0.2;
  if (rank_ == 0)
    printf("nonfinite: y[10]=%g y[20]=%g y[30]=%g, other elements nmse=%.3g (exact), next call nmse=%.3g -> %s\n",
           y[10], y[20], y[30], e1, e2, ok ? "ok" : "WRONG");
  free(x);
  free(y);
  free(xf);
  free(yf);
  return ok;
}

struct Worker {
  MPI_Comm comm;
  int delay_ms;
  int ok;
};

static void* worker(void* arg) {
  struct Worker* w = arg;
  usleep(w->delay_ms * 1000);
  float* x = malloc(sizeof(float) * kBig);
  float* y = malloc(sizeof(float) * kBig);
  unsigned s = 5 + rank_;
  for (int i = 0; i < kBig; ++i) x[i] = frand(&s);
  w->ok = 1;
  for (int it = 0; it < 4; ++it) {
    if (MPI_Allreduce(x, y, kBig, MPI_FLOAT, MPI_SUM, w->comm) != MPI_SUCCESS) w->ok = 0;
  }
  free(x);
  free(y);
  return NULL;
}

static void watchdog(int sig) {
  (void)sig;
  static const char msg[] = "interposer_checks threads: no progress for 90 s (deadlock)\n";
  (void)!write(2, msg, sizeof msg - 1);
  _exit(1);
}

static int check_threads(void) {
  MPI_Comm a, b;
  MPI_Comm_dup(MPI_COMM_WORLD, &a);
  MPI_Comm_dup(MPI_COMM_WORLD, &b);
  /* Even ranks start on a, odd ranks on b: a lock held across one collective would make each
   * rank wait for a neighbour that waits for the lock. */
  struct Worker wa = {a, rank_ % 2 ? 300 : 0, 0}, wb = {b, rank_ % 2 ? 0 : 300, 0};
  signal(SIGALRM, watchdog);
  alarm(90);
  pthread_t ta, tb;
  pthread_create(&ta, NULL, worker, &wa);
  pthread_create(&tb, NULL, worker, &wb);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  alarm(0);
  MPI_Comm_free(&a);
  MPI_Comm_free(&b);
  if (rank_ == 0) printf("threads: %s\n", wa.ok && wb.ok ? "ok" : "WRONG");
  return wa.ok && wb.ok;
}

static int check_commfree(void) {
  float* x = malloc(sizeof(float) * kBig);
  float* y = malloc(sizeof(float) * kBig);
  unsigned s = 3 + rank_;
  for (int i = 0; i < kBig; ++i) x[i] = frand(&s);
  MPI_Comm a, b;
  MPI_Comm_dup(MPI_COMM_WORLD, &a);
  const void* handle_a = (const void*)a;
  /* Leaves an error-feedback residual for (y, kBig) on a. */
  int ok = MPI_Allreduce(x, y, kBig, MPI_FLOAT, MPI_SUM, a) == MPI_SUCCESS;
  MPI_Comm_free(&a);
  MPI_Comm_dup(MPI_COMM_WORLD, &b);
  const int reused = (const void*)b == handle_a;
  /* A fresh communicator: zeros in, exact zeros out. */
  memset(x, 0, sizeof(float) * kBig);
  ok = ok && MPI_Allreduce(x, y, kBig, MPI_FLOAT, MPI_SUM, b) == MPI_SUCCESS;
  int nonzero = 0;
  for (int i = 0; i < kBig; ++i)
    if (y[i] != 0.0f) nonzero++;
  ok = ok && nonzero == 0;
  printf("rank %d commfree: handle %s, %d non-zero outputs from zero input -> %s\n", rank_,
         reused ? "reused" : "not reused", nonzero, ok ? "ok" : "WRONG");
  MPI_Comm_free(&b);
  free(x);
  free(y);
  return ok;
}

/* IEEE binary16 and bfloat16 <-> float (round to nearest even), for the reference sums. */
static float h2f(uint16_t h) {
  const uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  float v;
  if (e == 0) v = ldexpf((float)m, -24);
  else if (e == 31) v = m ? NAN : INFINITY;
  else v = ldexpf((float)(m | 0x400), (int)e - 25);
  return s ? -v : v;
}
static uint16_t f2h(float f) {
  if (isnan(f)) return 0x7E00;
  const uint16_t sign = signbit(f) ? 0x8000 : 0;
  f = fabsf(f);
  if (f >= 65520.0f) return sign | 0x7C00;
  if (f < ldexpf(1.0f, -14)) return sign | (uint16_t)lrintf(ldexpf(f, 24)); /* subnormal, nearest even */
  int e;
  const float m = frexpf(f, &e); /* f = m 2^e, m in [0.5, 1) */
  uint32_t q = (uint32_t)lrintf(ldexpf(m, 11)); /* 11 significant bits */
  if (q == 2048) { q = 1024; ++e; }
  if (e + 14 >= 31) return sign | 0x7C00;
  return sign | (uint16_t)((e + 14) << 10) | (uint16_t)(q & 0x3FF);
}
static float b2f(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint16_t f2b(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* One 16-bit type: NaN/Inf in the input of two ranks; MPI_Allreduce(MPI_SUM) must return the
 * exact sum, rounded once to the type (2 ranks: one addition per element), NaN and Inf where MPI
 * would put them; and the same for a call too small to compress. */
static int check16(const char* what, MPI_Datatype dt, float (*to_f)(uint16_t), uint16_t (*from_f)(float), int n) {
  uint16_t* x = malloc(sizeof(uint16_t) * n);
  uint16_t* y = malloc(sizeof(uint16_t) * n);
  float* xf = malloc(sizeof(float) * n);
  float* ref = malloc(sizeof(float) * n);
  unsigned s = 13 + rank_;
  for (int i = 0; i < n; ++i) x[i] = from_f(frand(&s) * 8.0f);
  if (n > 30) {
    if (rank_ == 0) {
      x[10] = from_f(NAN);
      x[20] = from_f(INFINITY);
    }
    if (rank_ == size_ - 1) {
      x[20] = from_f(-INFINITY);
      x[30] = from_f(INFINITY);
    }
  }
  for (int i = 0; i < n; ++i) xf[i] = to_f(x[i]);
  MPI_Allreduce(xf, ref, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); /* exact in float for two ranks */
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  const int rc = MPI_Allreduce(x, y, n, dt, MPI_SUM, MPI_COMM_WORLD);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  int ok = rc == MPI_SUCCESS, wrong = 0;
  for (int i = 0; ok && i < n; ++i) {
    const uint16_t want = from_f(ref[i]);
    if (isnan(ref[i]) ? !isnan(to_f(y[i])) : y[i] != want) ++wrong;
  }
  ok = ok && wrong == 0;
  if (rank_ == 0 || !ok) {
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (rc != MPI_SUCCESS) MPI_Error_string(rc, text, &len);
    printf("nonfinite16 %s, %d elements: rc=%d %s, %d elements differ from MPI's sum -> %s\n", what, n, rc, text, wrong,
           ok ? "ok" : "WRONG");
  }
  free(x);
  free(y);
  free(xf);
  free(ref);
  return ok;
}

static int check_nonfinite16(void) {
  MPI_Datatype (*f16)(void) = (MPI_Datatype(*)(void))dlsym(RTLD_DEFAULT, "THC_MPI_FLOAT16");
  MPI_Datatype (*bf16)(void) = (MPI_Datatype(*)(void))dlsym(RTLD_DEFAULT, "THC_MPI_BFLOAT16");
  if (!f16 || !bf16) {
    if (rank_ == 0) printf("nonfinite16: THC_MPI_FLOAT16/BFLOAT16 not found (is libthc_mpi.so preloaded?)\n");
    return 0;
  }
  int ok = 1;
  ok &= check16("float16", f16(), h2f, f2h, kBig);
  ok &= check16("bfloat16", bf16(), b2f, f2b, kBig);
  ok &= check16("float16 below THC_MIN_BYTES", f16(), h2f, f2h, 1000);
  return ok;
}

int main(int argc, char** argv) {
  const char* what = argc > 1 ? argv[1] : "";
  int provided = MPI_THREAD_SINGLE;
  if (strcmp(what, "threads") == 0)
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  else
    MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  int mine;
  if (strcmp(what, "errhandler") == 0) {
    mine = check_errhandler();
  } else if (strcmp(what, "nonfinite") == 0) {
    mine = check_nonfinite();
  } else if (strcmp(what, "threads") == 0) {
    if (provided < MPI_THREAD_MULTIPLE) {
      if (rank_ == 0) printf("threads: MPI_THREAD_MULTIPLE not provided (%d), skipped\n", provided);
      MPI_Finalize();
      return 77;
    }
    mine = check_threads();
  } else if (strcmp(what, "commfree") == 0) {
    mine = check_commfree();
  } else if (strcmp(what, "nonfinite16") == 0) {
    if (size_ != 2) {
      if (rank_ == 0) printf("nonfinite16: runs on 2 ranks (the reference is one addition per element)\n");
      MPI_Finalize();
      return 2;
    }
    mine = check_nonfinite16();
  } else {
    if (rank_ == 0) fprintf(stderr, "usage: interposer_checks errhandler|nonfinite|nonfinite16|threads|commfree\n");
    MPI_Finalize();
    return 2;
  }
  int all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Finalize();
  return all ? 0 : 1;
}
