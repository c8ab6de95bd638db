/* Parameter initializers, in place, with the formulas of torch.nn.init
 * (torch/nn/init.py): calculate_gain, _calculate_fan_in_and_fan_out,
 * uniform_, normal_, constant_, kaiming_uniform_/normal_ (He et al. 2015,
 * "Delving deep into rectifiers"), xavier_uniform_/normal_ (Glorot & Bengio
 * 2010, "Understanding the difficulty of training deep feedforward neural
 * networks"). Random draws use the global seeded Philox generator. */
#include "nn/nn_internal.h"

#include <math.h>

double em_init_calculate_gain(em_nonlinearity nl, double param)
{
    switch (nl) {
    case EM_NONLIN_LINEAR:
    case EM_NONLIN_SIGMOID: return 1.0;
    case EM_NONLIN_TANH: return 5.0 / 3.0;
    case EM_NONLIN_RELU: return sqrt(2.0);
    case EM_NONLIN_LEAKY_RELU: {
        double slope = param < 0 ? 0.01 : param;
        return sqrt(2.0 / (1.0 + slope * slope));
    }
    case EM_NONLIN_SELU: return 3.0 / 4.0;
    }
    return 1.0;
}

em_status em_init_fans(const em_tensor *t, int64_t *fan_in, int64_t *fan_out)
{
    if (!t) return em__set_error(EM_ERR_INVALID, "em_init_fans: tensor is NULL");
    int nd = em_tensor_ndim(t);
    if (nd < 2) {
        char b[160];
        return em__set_error(EM_ERR_SHAPE,
                             "em_init_fans: fan in and fan out can not be computed for a tensor with fewer than 2 dimensions (shape %s)",
                             NN_SHAPE(t, b));
    }
    const int64_t *s = em_tensor_shape(t);
    int64_t rf = 1;
    for (int i = 2; i < nd; i++) rf *= s[i];
    if (fan_in) *fan_in = s[1] * rf;
    if (fan_out) *fan_out = s[0] * rf;
    return EM_OK;
}

static em_status check_float(const em_tensor *t, const char *fn)
{
    if (!t) return em__set_error(EM_ERR_INVALID, "%s: tensor is NULL", fn);
    if (!em_dtype_is_float(em_tensor_dtype(t)))
        return em__set_error(EM_ERR_DTYPE, "%s: tensor must be a float dtype, got %s", fn, em_dtype_name(em_tensor_dtype(t)));
    return EM_OK;
}

/* t <- src under no-grad; src is scope-owned (released by the caller's scope). */
static em_status assign(em_tensor *t, em_tensor *src)
{
    if (!src) return em_last_status() != EM_OK ? em_last_status() : EM_ERR_RUNTIME;
    return em_copy_(t, src);
}

static em_status fill_random(em_tensor *t, int normal, double a, double b, const char *fn)
{
    em_status st = check_float(t, fn);
    if (st != EM_OK) return st;
    em_no_grad_begin();
    em_scope_begin();
    em_tensor *r = normal ? em_rand_normal(em_tensor_shape(t), em_tensor_ndim(t), em_tensor_dtype(t), a, b)
                          : em_rand_uniform(em_tensor_shape(t), em_tensor_ndim(t), em_tensor_dtype(t), a, b);
    st = assign(t, r);
    em_scope_end();
    em_no_grad_end();
    return st;
}

em_status em_init_constant_(em_tensor *t, double value)
{
    em_status st = check_float(t, "em_init_constant_");
    if (st != EM_OK) return st;
    em_no_grad_begin();
    em_scope_begin();
    st = assign(t, em_scalar(value, em_tensor_dtype(t)));
    em_scope_end();
    em_no_grad_end();
    return st;
}

em_status em_init_zeros_(em_tensor *t) { return em_init_constant_(t, 0.0); }
em_status em_init_ones_(em_tensor *t) { return em_init_constant_(t, 1.0); }

em_status em_init_uniform_(em_tensor *t, double a, double b)
{
    if (!(a <= b)) return em__set_error(EM_ERR_INVALID, "em_init_uniform_: a %g must be <= b %g", a, b);
    return fill_random(t, 0, a, b, "em_init_uniform_");
}

em_status em_init_normal_(em_tensor *t, double mean, double std)
{
    if (!(std >= 0)) return em__set_error(EM_ERR_INVALID, "em_init_normal_: std must be >= 0, got %g", std);
    return fill_random(t, 1, mean, std, "em_init_normal_");
}

static em_status kaiming_std(em_tensor *t, double a, em_fan_mode mode, em_nonlinearity nl, double *std, const char *fn)
{
    em_status st = check_float(t, fn);
    if (st != EM_OK) return st;
    if (mode != EM_FAN_IN && mode != EM_FAN_OUT) return em__set_error(EM_ERR_INVALID, "%s: mode must be EM_FAN_IN or EM_FAN_OUT", fn);
    int64_t fi, fo;
    st = em_init_fans(t, &fi, &fo);
    if (st != EM_OK) return st;
    int64_t fan = mode == EM_FAN_IN ? fi : fo;
    if (fan == 0) return em__set_error(EM_ERR_SHAPE, "%s: initializing a zero-element tensor (fan is 0)", fn);
    /* torch: kaiming with nonlinearity leaky_relu uses a as the slope (default 0). */
    double gain = em_init_calculate_gain(nl, nl == EM_NONLIN_LEAKY_RELU ? a : 0.0);
    *std = gain / sqrt((double)fan);
    return EM_OK;
}

em_status em_init_kaiming_uniform_(em_tensor *t, double a, em_fan_mode mode, em_nonlinearity nl)
{
    double std;
    em_status st = kaiming_std(t, a, mode, nl, &std, "em_init_kaiming_uniform_");
    if (st != EM_OK) return st;
    double bound = sqrt(3.0) * std;
    return fill_random(t, 0, -bound, bound, "em_init_kaiming_uniform_");
}

em_status em_init_kaiming_normal_(em_tensor *t, double a, em_fan_mode mode, em_nonlinearity nl)
{
    double std;
    em_status st = kaiming_std(t, a, mode, nl, &std, "em_init_kaiming_normal_");
    if (st != EM_OK) return st;
    return fill_random(t, 1, 0.0, std, "em_init_kaiming_normal_");
}

static em_status xavier_std(em_tensor *t, double gain, double *std, const char *fn)
{
    em_status st = check_float(t, fn);
    if (st != EM_OK) return st;
    int64_t fi, fo;
    st = em_init_fans(t, &fi, &fo);
    if (st != EM_OK) return st;
    if (fi + fo == 0) return em__set_error(EM_ERR_SHAPE, "%s: initializing a zero-element tensor", fn);
    *std = gain * sqrt(2.0 / (double)(fi + fo));
    return EM_OK;
}

em_status em_init_xavier_uniform_(em_tensor *t, double gain)
{
    double std;
    em_status st = xavier_std(t, gain, &std, "em_init_xavier_uniform_");
    if (st != EM_OK) return st;
    double a = sqrt(3.0) * std;
    return fill_random(t, 0, -a, a, "em_init_xavier_uniform_");
}

em_status em_init_xavier_normal_(em_tensor *t, double gain)
{
    double std;
    em_status st = xavier_std(t, gain, &std, "em_init_xavier_normal_");
    if (st != EM_OK) return st;
    return fill_random(t, 1, 0.0, std, "em_init_xavier_normal_");
}
