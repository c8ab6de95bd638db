/* The CPU conv family's two implementations (devices/cpu/conv.c): im2col +
 * OpenBLAS (f32 and f64) and oneDNN (f32, when the build found it:
 * EMBER_HAVE_DNNL; devices/cpu/conv_dnnl.c). */
#ifndef EMBER_CPU_CONV_DNNL_H
#define EMBER_CPU_CONV_DNNL_H

#include "devices/kargs.h"

enum { EM_CPU_CONV_IM2COL = 0, EM_CPU_CONV_ONEDNN = 1 };

/** The path f32 convs take: EMBER_CPU_CONV=im2col|onednn (read once), else
 *  oneDNN when built with it; im2col without oneDNN whatever is asked. */
EM_TEST_API int em__cpu_conv_path(void);
/** Tests: forces @p path (EM_CPU_CONV_*) for the convs that start after the
 *  call; -1 goes back to the environment's choice. */
EM_TEST_API void em__cpu_conv_set_path(int path);

/** Runs the conv kernel of @p k (f32, NCHW, contract at the top of
 *  tasks/conv.c) with oneDNN on the calling worker thread; @p bufs are the
 *  base pointers of in[0], in[1], out[0] (descriptor offsets not applied).
 *  Returns 1 when done (or failed with a kernel error reported), 0 when oneDNN
 *  has no primitive for this shape: the caller runs im2col. */
int em__cpu_conv_dnnl(const em_kargs *k, void **bufs);

#endif
