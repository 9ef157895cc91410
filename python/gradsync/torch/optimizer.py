"""DistributedOptimizer: Horovod's optimizer wrapper over gradsync.

Gradients are submitted from autograd hooks as soon as each one is
accumulated (so communication overlaps the rest of backward()), and
step()/synchronize() waits for them. Semantics as Horovod's: accumulation
over backward_passes_per_step passes in p.grad, Average as sum postscaled by
1/size (gradient_predivide_factor splits it into prescale/postscale),
parameters without a gradient on this rank contribute zeros, sparse
gradients are gathered (or densified with sparse_as_dense), and
groups/num_groups submit several gradients as one grouped allreduce.
Beyond Horovod: local_parameters (model parallel) are never communicated;
their gradient is scaled by 1/size like Horovod's scale_local_gradients.
"""

import contextlib
import warnings
from collections import defaultdict

import torch

from .._lib import lib
from . import _core
from .compression import Compression
from .functions import _local, is_local_parameter
from .mpi_ops import (Adasum, Average, _check_ps, global_process_set, grouped_allreduce_async_,
                      allreduce_async_, size, sparse_allreduce_async, synchronize)


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1,
                 op=Average, gradient_predivide_factor=1.0, groups=None, num_groups=0,
                 sparse_as_dense=False, local_parameters=None, process_set=global_process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression

        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [("noname.%d.%d" % (i, j), v)
                                for i, group in enumerate(self.param_groups)
                                for j, v in enumerate(group["params"])]
        if any(not isinstance(p, tuple) for p in named_parameters):
            raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                             "usually produced by model.named_parameters().")
        names = [k for k, _ in named_parameters]
        dups = sorted({k for k in names if names.count(k) > 1})
        if dups:
            raise ValueError("Parameter names in named_parameters must be unique. "
                             "Found duplicates: %s" % ", ".join(dups))
        all_ids = {id(v) for g in self.param_groups for v in g["params"]}
        named_ids = {id(v) for _, v in named_parameters}
        unnamed = all_ids - named_ids
        if unnamed:
            raise ValueError("named_parameters was specified, but one or more model parameters "
                             "were not named. Python object ids: %s"
                             % ", ".join(str(i) for i in sorted(unnamed)))
        self._parameter_names = {v: k for k, v in sorted(named_parameters, key=lambda kv: kv[0])}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for _, v in
                                 sorted(named_parameters, key=lambda kv: kv[0])}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._handles = {}
        self._grad_accs = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        self._local_registered = set()

        for p in local_parameters or []:
            if not any(p is q for g in self.param_groups for q in g["params"]):
                raise ValueError("local_parameters: a tensor of shape %s is not a parameter of "
                                 "this optimizer" % (list(p.shape),))
            _local[id(p)] = p

        # groups: lists of parameters submitted together as one grouped op
        self._p_to_group = {}
        self._group_members = []
        if groups is not None:
            if not isinstance(groups, list) or not all(isinstance(g, list) for g in groups):
                raise ValueError("groups should be a list of lists of parameters")
            seen = set()
            for g in groups:
                members = []
                for p in g:
                    if not isinstance(p, torch.Tensor) or id(p) not in all_ids:
                        raise ValueError("groups: every entry must be a parameter of this "
                                         "optimizer")
                    if id(p) in seen:
                        raise ValueError("groups: a parameter appears in more than one group")
                    seen.add(id(p))
                    members.append(p)
                if members:
                    self._add_group(members)
        elif num_groups and num_groups > 0:
            ps = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
            k = max(1, -(-len(ps) // num_groups))
            for i in range(0, len(ps), k):
                self._add_group(ps[i:i + k])
        self._group_ready = defaultdict(set)

        if size() > 1:
            self._register_hooks()

    def _add_group(self, members):
        gi = len(self._group_members)
        members = [p for p in members if not is_local_parameter(p)]
        if not members:
            return
        self._group_members.append(members)
        for p in members:
            self._p_to_group[p] = gi

    def _name(self, p):
        return self._parameter_names.get(p)

    def _register_hooks(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    self._requires_update.add(p)
                    p_tmp = p.expand_as(p)
                    grad_acc = p_tmp.grad_fn.next_functions[0][0]
                    grad_acc.register_hook(self._make_hook(p))
                    self._grad_accs.append(grad_acc)

    def _register_local(self, p):
        if p in self._local_registered:
            return
        name = "allreduce.%s" % self._name(p)
        st = lib.gs_register_local(_core.ctx(), name.encode())
        if st != 0:
            _core.raise_submit_error(st, name)
        self._local_registered.add(p)

    def _scales(self):
        if self.op == Average:
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _allreduce_grad_async(self, p):
        if p.grad is None:
            # no gradient on this rank: the other ranks may have one
            p.grad = p.data.new(p.size()).zero_()
        name = self._name(p)
        tensor = p.grad
        if is_local_parameter(p):
            self._register_local(p)
        if tensor.is_sparse:
            if self.sparse_as_dense:
                tensor = tensor.to_dense()
            else:
                return sparse_allreduce_async(tensor, name=name, op=self.op,
                                              process_set=self.process_set), None
        compressed, ctx = self._compression.compress(tensor)
        pre, post = self._scales()
        handle = allreduce_async_(compressed, name=name, op=self.op, prescale_factor=pre,
                                  postscale_factor=post, process_set=self.process_set)
        return handle, (ctx, compressed)

    def _group_allreduce_async(self, gi):
        members = self._group_members[gi]
        tensors, ctxs = [], []
        for p in members:
            if p.grad is None:
                p.grad = p.data.new(p.size()).zero_()
            t = p.grad.to_dense() if p.grad.is_sparse else p.grad
            c, cx = self._compression.compress(t)
            tensors.append(c)
            ctxs.append(cx)
        pre, post = self._scales()
        handle = grouped_allreduce_async_(tensors, name="group.%s" % self._name(members[0]),
                                          op=self.op, prescale_factor=pre,
                                          postscale_factor=post, process_set=self.process_set)
        for p, c, cx in zip(members, tensors, ctxs):
            self._handles[p] = (handle, (cx, c), gi)
        self._group_ready.pop(gi, None)

    def _submit(self, p):
        gi = self._p_to_group.get(p)
        if gi is None:
            handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx, None)
            return
        self._handles[p] = (None, None, gi)
        self._group_ready[gi].add(p)
        if len(self._group_ready[gi]) == len(self._group_members[gi]):
            self._group_allreduce_async(gi)

    def _make_hook(self, p):
        def hook(*ignore):
            if p in self._handles and self._handles[p][0] is not None:
                if self._allreduce_delay[p] <= 0:
                    raise AssertionError(
                        "Gradients were computed more than backward_passes_per_step times "
                        "before call to step(). Increase backward_passes_per_step to "
                        "accumulate gradients locally.")
            assert not p.grad.requires_grad
            assert self._allreduce_delay[p] > 0
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                self._submit(p)
        return hook

    def synchronize(self):
        """Waits for every gradient's allreduce (submitting those whose hook
        did not run: zeros for parameters without a gradient here) and
        writes the results into p.grad."""
        missing = self._requires_update - set(self._handles.keys())
        for p in sorted(missing, key=lambda q: self._name(q) or ""):
            self._submit(p)
        # groups that are only partly ready are submitted whole
        for gi in list(self._group_ready.keys()):
            for q in self._group_members[gi]:
                if q not in self._handles:
                    self._handles[q] = (None, None, gi)
            self._group_allreduce_async(gi)
        done_groups = {}
        errors = []
        for p, (handle, ctx, gi) in list(self._handles.items()):
            try:
                if gi is not None:
                    if gi not in done_groups:
                        outs = synchronize(handle)
                        done_groups[gi] = dict(zip(self._group_members[gi], outs))
                    output = done_groups[gi][p]
                elif callable(handle):
                    output = handle()
                else:
                    output = synchronize(handle)
            except Exception as e:  # keep collecting: every handle must be released
                errors.append(e)
                continue
            self._allreduce_delay[p] = self.backward_passes_per_step
            if output.is_sparse:
                p.grad = output
                continue
            cx = ctx[0] if ctx is not None else None
            result = self._compression.decompress(output, cx)
            if p.grad.is_sparse:
                p.grad = result
            elif result.data_ptr() != p.grad.data_ptr():
                p.grad.set_(result)
        self._handles.clear()
        self._group_ready.clear()
        self._synchronized = True
        if errors:
            for p in self._allreduce_delay:
                self._allreduce_delay[p] = self.backward_passes_per_step
            raise errors[0]

    @contextlib.contextmanager
    def skip_synchronize(self):
        """For use after a manual synchronize(): step() inside this context
        does not synchronize again."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        """synchronize() (unless inside skip_synchronize()), then the wrapped
        optimizer's step(closure); returns what that returns. Warns when
        called after a manual synchronize() outside skip_synchronize(). A
        failed allreduce raises its HorovodInternalError here, after every
        gradient's op was waited for, and the step is not taken."""
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without "
                              "optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training "
                              "slowdown. You may want to consider using "
                              "optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.")
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        """The wrapped optimizer's zero_grad(). Raises AssertionError while
        gradients are being allreduced (after backward(), before step() or
        synchronize()): zeroing them would race with the allreduce."""
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() "
                                 "but before optimizer.step() or optimizer.synchronize(). "
                                 "This is prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set, local_parameters=None):
    """Wraps optimizer so that step() averages the gradients over all ranks
    first (Horovod's hvd.DistributedOptimizer, same arguments). Beyond
    Horovod: local_parameters, a list of parameters local to this rank
    (model parallel), never communicated and scaled by 1/size."""
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if op == Adasum:
        raise NotImplementedError("gradsync does not support the Adasum reduction yet; "
                                  "use op=hvd.Average")
    if num_groups != 0 and groups is not None:
        raise ValueError("num_groups and groups are mutually exclusive; give one of them")
    _check_ps(process_set)  # here, not at the first step()
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, groups, num_groups, sparse_as_dense,
               local_parameters, process_set)
