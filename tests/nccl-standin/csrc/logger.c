/* NCCL's ncclDebugLogger_t is C-variadic; stable Rust cannot define such a function, so this one formats
 * the message with vsnprintf and hands the finished line to the Rust logger. */
#include <stdarg.h>
#include <stdio.h>

extern void nccl_standin_log_line(int level, unsigned long flags, const char* file, int line, const char* msg);

void nccl_standin_debug_log(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  if (fmt == NULL) return;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  nccl_standin_log_line(level, flags, file, line, buf);
}
