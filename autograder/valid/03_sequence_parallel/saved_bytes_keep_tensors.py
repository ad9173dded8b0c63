"""saved_bytes keeping the saved tensors themselves (which keep their storages alive) and
counting the distinct storages once at the end, the excluded ones compared by storage
identity through untyped_storage()'s data_ptr, after fn has run."""

PASSES = ["check_saved_bytes"]


def saved_bytes(fn, *args, exclude=()):
    kept = []

    def pack(tensor):
        kept.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):  # noqa: F821
        fn(*args)
    skip = {tensor.untyped_storage().data_ptr() for tensor in exclude}
    sizes = {tensor.untyped_storage().data_ptr(): tensor.untyped_storage().nbytes()
             for tensor in kept}
    return int(sum(n for ptr, n in sizes.items() if ptr not in skip))
