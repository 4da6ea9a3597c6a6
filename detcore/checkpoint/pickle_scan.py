"""What a checkpoint's pickles would build, judged by type before anything is built.

Checkpoints are unpickled by restricted loaders (io.py's for model-zoo pickles, torch's
``weights_only=True`` for torch files): both refuse globals outside a short list. Some allowed ones
still build objects whose size is a number written in the file rather than data in it:
``bytearray(2**32)`` is a 32-byte pickle and 4 GB of memory (both loaders allow ``bytearray``), and
``list(range(2**40))`` expands a lazy range. Other allowed objects are unsafe to build from hostile
input: numpy crashes on an object array whose contents do not match its shape.

``check_pickle`` walks a pickle's opcodes with pickletools (which constructs nothing), tracking only
what kind of value each stack slot holds, and refuses:

* a constructor that allocates by number (``bytes``, ``bytearray``, a torch tensor or storage
  class, numpy's array) given a positive integer, or arguments not written in the file; numpy's
  own pickles write shape ``(0,)`` and fill the array from bytes in the file;
* a container or string built from a lazy sequence (``range``), and a string built from a
  container (its repr can expand a graph of shared references exponentially);
* numpy object and structured dtypes (model weights are numbers);
* a storage whose declared element count exceeds the file's size in bytes (torch's legacy format
  allocates it before reading its data).

Refusals name the file. What the loaders refuse themselves (unknown globals) is left to them.
"""
import _compat_pickle
import io
import os
import pickle
import pickletools
import zipfile

__all__ = ["PickleRefused", "check_pickle_file", "check_zip_archive"]


class PickleRefused(pickle.UnpicklingError):
    """A pickle that would build something large or unsafe from little data."""


_UNKNOWN = ("unknown",)
_LEGACY_TORCH_MAGIC = 0x1950A86A20F9469CFC6C  # torch.serialization.MAGIC_NUMBER, the legacy format's first pickle
_SIZED_BY_NUMBER = {"builtins.bytes", "builtins.bytearray", "numpy.ndarray", "numpy._core.multiarray._reconstruct"}
_BUILT_FROM_CONTENTS = {
    "builtins.list", "builtins.tuple", "builtins.set", "builtins.frozenset", "builtins.dict", "builtins.bytes",
    "builtins.bytearray", "builtins.str", "collections.OrderedDict", "collections.Counter",
}  # fmt: skip
_RESULT_KINDS = {
    "builtins.range": ("range",),
    "builtins.str": ("str", None),
    "builtins.bytes": ("bytes",),
    "builtins.bytearray": ("bytes",),
    "_codecs.encode": ("bytes",),
    "builtins.int": ("int", None),
}
_SCALAR_KINDS = {"str", "bytes", "int", "float", "bool", "none"}
_PUSHES = {  # opcodes that push one value of a known kind (integers and strings keep their value)
    "NONE": ("none",), "NEWTRUE": ("bool",), "NEWFALSE": ("bool",), "FLOAT": ("float",), "BINFLOAT": ("float",),
    "BINBYTES": ("bytes",), "SHORT_BINBYTES": ("bytes",), "BINBYTES8": ("bytes",), "BYTEARRAY8": ("bytes",),
    "EMPTY_LIST": ("list",), "EMPTY_DICT": ("dict",), "EMPTY_SET": ("set",), "EMPTY_TUPLE": ("tuple", ()),
    "NEXT_BUFFER": _UNKNOWN, "READONLY_BUFFER": _UNKNOWN,
}  # fmt: skip
_INTS = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4"}
_STRINGS = {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8"}
_FROM_MARK = {"TUPLE": "tuple", "LIST": "list", "DICT": "dict", "FROZENSET": "set"}
_INTO_BELOW_MARK = {"APPENDS", "SETITEMS", "ADDITEMS"}  # add the marked items to the container below
_PUT = {"PUT", "BINPUT", "LONG_BINPUT"}
_GET = {"GET", "BINGET", "LONG_BINGET"}


def _canonical(module: str, name: str) -> str:
    # Python 2 names as the unpicklers map them (__builtin__.xrange is builtins.range).
    if (module, name) in _compat_pickle.NAME_MAPPING:
        module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    elif module in _compat_pickle.IMPORT_MAPPING:
        module = _compat_pickle.IMPORT_MAPPING[module]
    if module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        module = "numpy._core.multiarray"
    return f"{module}.{name}"


def _is_tensor_or_storage_class(name: str) -> bool:
    return name.startswith("torch.") and name.rsplit(".", 1)[-1].endswith(("Tensor", "Storage"))


def _ints_in(kinds) -> list:
    """The integers among ``kinds`` and inside the tuples among them (shapes); None where not
    known (computed by a call)."""
    found = []
    for kind in kinds:
        if kind[0] == "int":
            found.append(kind[1])
        elif kind[0] == "tuple" and kind[1] is not None:
            found += [item[1] for item in kind[1] if item[0] == "int"]
    return found


class _Scan:
    def __init__(self, file_size: int, source: str):
        self.file_size = file_size
        self.source = source

    def refuse(self, why: str):
        raise PickleRefused(f"refusing to load {self.source}: {why}")

    def call(self, function, args) -> tuple:
        """The kind a call of ``function`` with ``args`` (a kind) returns, once it is judged."""
        if function[0] != "global":
            self.refuse(f"it calls a {function[0]} value rather than a constructor it names")
        name = function[1]
        if args[0] != "tuple" or args[1] is None:
            if name in _SIZED_BY_NUMBER or name in _BUILT_FROM_CONTENTS or _is_tensor_or_storage_class(name):
                self.refuse(f"it calls {name} with arguments that are not written in the file")
            return ("object", name)
        arguments = args[1]
        if name in _SIZED_BY_NUMBER or _is_tensor_or_storage_class(name):
            sizes = [n for n in _ints_in(arguments) if n is None or n > 0]
            if sizes:
                number = sizes[0] if sizes[0] is not None else "a computed number"
                self.refuse(f"{name}({number}) would allocate memory by a number written in the file, not build "
                            "from data in it (a checkpoint holds tensors and plain containers)")
        if name in _BUILT_FROM_CONTENTS and any(kind[0] == "range" for kind in arguments):
            self.refuse(f"it expands a range into {name}")
        if name == "builtins.str" and any(kind[0] not in _SCALAR_KINDS for kind in arguments):
            self.refuse("it builds a string from a container")
        if name == "numpy.dtype" and arguments and arguments[0][0] == "str":
            code = (arguments[0][1] or "").lstrip("<>|=")
            if code[:1] in ("O", "V"):
                self.refuse(f"it holds a numpy array of dtype {arguments[0][1]!r} (objects or records, not numbers)")
        return _RESULT_KINDS.get(name, ("object", name))

    def persistent(self, pid) -> tuple:
        # torch: ('storage', storage type, key, location, element count[, view])
        if pid[0] == "tuple" and pid[1] is not None:
            counts = [n for n in _ints_in(pid[1]) if n is None or n > self.file_size]
            if counts:
                self.refuse(f"it declares a storage of {counts[0]} elements in a file of {self.file_size} bytes")
        return ("storage",)

    def run(self, stream) -> tuple:
        """Judge one pickle read from ``stream`` (left after its STOP); returns the kind of its value.
        A malformed pickle ends the scan quietly: the loader fails there too, after nothing more
        than what was judged."""
        stack, memo, marks = [], {}, []

        def pop():
            if not stack:
                raise ValueError("stack underflow")
            return stack.pop()

        def pop_mark():
            if not marks:
                raise ValueError("no mark")
            start = marks.pop()
            items = stack[start:]
            del stack[start:]
            return items

        try:
            for opcode, arg, _ in pickletools.genops(stream):
                name = opcode.name
                if name in _PUSHES:
                    stack.append(_PUSHES[name])
                elif name in _INTS:
                    stack.append(("int", int(arg)))
                elif name in _STRINGS:
                    stack.append(("str", arg if isinstance(arg, str) and len(arg) <= 64 else None))
                elif name == "MARK":
                    marks.append(len(stack))
                elif name in _FROM_MARK:
                    items = pop_mark()
                    stack.append(("tuple", tuple(items)) if name == "TUPLE" else (_FROM_MARK[name],))
                elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                    count = int(name[-1])
                    items = [pop() for _ in range(count)][::-1]
                    stack.append(("tuple", tuple(items)))
                elif name in _INTO_BELOW_MARK:
                    pop_mark()
                    if not stack:
                        raise ValueError("no container")
                elif name == "APPEND":
                    pop()
                elif name == "SETITEM":
                    pop(), pop()
                elif name == "POP":
                    if marks and marks[-1] == len(stack):
                        marks.pop()
                    else:
                        pop()
                elif name == "POP_MARK":
                    pop_mark()
                elif name == "DUP":
                    stack.append(stack[-1] if stack else _UNKNOWN)
                elif name in _PUT:
                    memo[arg] = stack[-1] if stack else _UNKNOWN
                elif name == "MEMOIZE":
                    memo[len(memo)] = stack[-1] if stack else _UNKNOWN
                elif name in _GET:
                    if arg not in memo:
                        raise ValueError("memo miss")
                    stack.append(memo[arg])
                elif name == "GLOBAL":
                    module, _, attribute = arg.partition(" ")
                    stack.append(("global", _canonical(module, attribute)))
                elif name == "STACK_GLOBAL":
                    attribute, module = pop(), pop()
                    known = module[0] == "str" and attribute[0] == "str" and module[1] and attribute[1]
                    stack.append(("global", _canonical(module[1], attribute[1])) if known else _UNKNOWN)
                elif name in ("EXT1", "EXT2", "EXT4"):
                    stack.append(_UNKNOWN)
                elif name == "REDUCE":
                    args = pop()
                    stack.append(self.call(pop(), args))
                elif name == "NEWOBJ":
                    args = pop()
                    stack.append(self.call(pop(), args))
                elif name == "NEWOBJ_EX":
                    pop()  # keyword arguments
                    args = pop()
                    stack.append(self.call(pop(), args))
                elif name == "INST":
                    module, _, attribute = arg.partition(" ")
                    stack.append(self.call(("global", _canonical(module, attribute)), ("tuple", tuple(pop_mark()))))
                elif name == "OBJ":
                    items = pop_mark()
                    if not items:
                        raise ValueError("OBJ without a class")
                    stack.append(self.call(items[0], ("tuple", tuple(items[1:]))))
                elif name == "BUILD":
                    pop()  # the state; the object stays
                elif name == "PERSID":
                    stack.append(("storage",))
                elif name == "BINPERSID":
                    stack.append(self.persistent(pop()))
                elif name == "STOP":
                    return pop()
                # PROTO, FRAME: no value
        except ValueError as e:  # malformed: pickletools' own errors and the stack's
            if "but only" in str(e) and "remain" in str(e):
                # "expected 4294967296 bytes in a bytes8, but only 3 remain": Python's unpickler
                # allocates the declared length before it finds the data missing.
                self.refuse(f"it declares more data than the file holds ({e})")
            return _UNKNOWN
        return _UNKNOWN


def check_pickle_file(data: bytes, source: str) -> None:
    """Judge a plain pickle, or the pickles of a legacy torch file (its magic number, protocol,
    system info, the object and its storage keys; the raw storage bytes after them are data)."""
    stream, scan = io.BytesIO(data), _Scan(len(data), source)
    if scan.run(stream) == ("int", _LEGACY_TORCH_MAGIC):
        for _ in range(4):
            scan.run(stream)


def check_zip_archive(path, source: str) -> None:
    """Judge a zip archive (torch.save's format): every member no larger than the archive (torch
    writes them uncompressed; a compressed one could expand without bound) and every pickle in it."""
    size = os.path.getsize(path)
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError):
        return  # cut short or not a zip after all: the loader says so
    with archive:
        members = archive.infolist()
        for info in members:
            if info.file_size > size:
                _Scan(size, source).refuse(
                    f"its member {info.filename!r} would expand to {info.file_size} bytes from an archive of {size}"
                )
        for info in members:
            if info.filename.endswith(".pkl"):
                _Scan(size, source).run(io.BytesIO(archive.read(info)))
