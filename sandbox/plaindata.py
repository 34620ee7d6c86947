"""Plain data across process boundaries: a tagged JSON encoding of builtin values by EXACT type.

Standard library only. Used on both sides of a code verdict (spogw_dagster/benchmarks/verdict.py): the
solution's process encodes its answers, the parent decodes them strictly (that decoder is the security
boundary: whatever the solution did to its own process, only plain data gets past it), re-encodes them
and the test program's process decodes them into fresh builtin objects. The sandbox-side hosts get this
file's text prepended to their own (they run as `python -I -S -c <text>`, with nothing importable).

Every value is a JSON array [tag, payload...]:
    None  ["N"]            bool ["B", true]       int ["I", hex]         float ["F", float.hex()]
    complex ["C", re, im]  str ["S", text]        bytes ["Y", hex]
    list ["L", [..]]   tuple ["T", [..]]   set ["E", [..]]   frozenset ["R", [..]]   dict ["D", [[k, v], ..]]
Types are checked with `type(v) is ...`, never isinstance: a subclass (an int whose __eq__ always returns
True, a namedtuple, an IntEnum) is not plain data. So `(1, 2)` stays a tuple and never equals `[1, 2]`,
True stays a bool, and floats (nan, inf, -0.0 included) survive bit for bit. Ints travel as hex, which
has no digit limit (unlike decimal: sys.get_int_max_str_digits).
"""

MAX_DEPTH = 100  # nesting of containers
MAX_NODES = 1_000_000  # values in one message


class NotPlainData(TypeError):
    """A value that is not plain data (or a malformed encoding of one)."""



PLAIN_TYPES_TEXT = ("None, bool, int, float, complex, str, bytes and list/tuple/dict/set/frozenset of those "
                    "(exact types, no subclasses)")


def type_name(value):
    t = type(value)
    module = getattr(t, "__module__", "?")
    name = getattr(t, "__qualname__", "?")
    return name if module == "builtins" else "%s.%s" % (module, name)


def encode(value, _depth=0, _count=None):
    """The tagged JSON form of `value`; raises NotPlainData for anything else."""
    count = _count if _count is not None else [0]
    count[0] += 1
    if count[0] > MAX_NODES:
        raise NotPlainData("more than %d values" % MAX_NODES)
    t = type(value)
    if t is type(None):
        return ["N"]
    if t is bool:
        return ["B", value]
    if t is int:
        return ["I", int.__format__(value, "x")]
    if t is float:
        return ["F", float.hex(value)]
    if t is complex:
        return ["C", float.hex(value.real), float.hex(value.imag)]
    if t is str:
        return ["S", value]
    if t is bytes:
        return ["Y", bytes.hex(value)]
    # `is`, not `in`/dict lookup: those compare with ==, which a metaclass can answer
    tag = "L" if t is list else "T" if t is tuple else "E" if t is set else "R" if t is frozenset else \
        "D" if t is dict else None
    if tag is None:
        raise NotPlainData("a %s is not plain data: only %s cross to the tests" % (type_name(value), PLAIN_TYPES_TEXT))
    if _depth >= MAX_DEPTH:
        raise NotPlainData("containers nested deeper than %d (or a container that holds itself)" % MAX_DEPTH)
    if t is dict:
        return ["D", [[encode(k, _depth + 1, count), encode(v, _depth + 1, count)] for k, v in dict.items(value)]]
    return [tag, [encode(v, _depth + 1, count) for v in value]]


def _hex_int(s):
    if type(s) is not str or not s or len(s) > 4_000_000:
        raise NotPlainData("bad int payload")
    body = s[1:] if s[0] == "-" else s
    if not body or any(c not in "0123456789abcdef" for c in body):
        raise NotPlainData("bad int payload")
    return int(s, 16)


def _hex_float(s):
    if type(s) is not str or len(s) > 40:
        raise NotPlainData("bad float payload")
    try:
        return float.fromhex(s)
    except (ValueError, OverflowError):
        raise NotPlainData("bad float payload") from None


def decode(node, _depth=0, _count=None):
    """The value a tagged JSON node stands for, built from fresh builtin objects; NotPlainData if malformed."""
    count = _count if _count is not None else [0]
    count[0] += 1
    if count[0] > MAX_NODES:
        raise NotPlainData("more than %d values" % MAX_NODES)
    if type(node) is not list or not node or type(node[0]) is not str:
        raise NotPlainData("not a tagged value")
    tag, n = node[0], len(node)
    if tag == "N" and n == 1:
        return None
    if tag == "B" and n == 2 and type(node[1]) is bool:
        return node[1]
    if tag == "I" and n == 2:
        return _hex_int(node[1])
    if tag == "F" and n == 2:
        return _hex_float(node[1])
    if tag == "C" and n == 3:
        return complex(_hex_float(node[1]), _hex_float(node[2]))
    if tag == "S" and n == 2 and type(node[1]) is str:
        return node[1]
    if tag == "Y" and n == 2 and type(node[1]) is str:
        try:
            return bytes.fromhex(node[1])
        except ValueError:
            raise NotPlainData("bad bytes payload") from None
    if tag in ("L", "T", "E", "R", "D") and n == 2 and type(node[1]) is list:
        if _depth >= MAX_DEPTH:
            raise NotPlainData("containers nested deeper than %d" % MAX_DEPTH)
        if tag == "D":
            out = {}
            for pair in node[1]:
                if type(pair) is not list or len(pair) != 2:
                    raise NotPlainData("bad dict item")
                key = decode(pair[0], _depth + 1, count)
                try:
                    out[key] = decode(pair[1], _depth + 1, count)
                except TypeError as e:  # an unhashable key
                    raise NotPlainData("bad dict key: %s" % e) from None
            return out
        items = [decode(v, _depth + 1, count) for v in node[1]]
        if tag == "L":
            return items
        if tag == "T":
            return tuple(items)
        try:
            return set(items) if tag == "E" else frozenset(items)
        except TypeError as e:  # an unhashable element
            raise NotPlainData("bad set element: %s" % e) from None
    raise NotPlainData("unknown or malformed tag %r" % (tag[:10],))


def checked(node):
    """`node` itself, once it is known that `decode(node)` succeeds; NotPlainData (or RecursionError) if not.

    For the parent, which relays what one sandboxed process sends to the other: it accepts exactly what
    `decode` accepts, in time linear in the node, but builds no set or dict. Building one costs quadratic time
    when its elements' hashes collide (ints i * (2**61 - 1) all hash alike), and the sender picks them: 30,000
    such ints in a 1 MB reply held the parent's event loop for ~10 s, so that other verdicts in flight timed
    out. The receiving process, sandboxed and time-limited, builds the values (and pays for that)."""
    _check(node, 0, [0])
    return node


def _check(node, depth, count):
    """Validate like decode (same node count, depth and payload rules); returns whether the value is hashable."""
    count[0] += 1
    if count[0] > MAX_NODES:
        raise NotPlainData("more than %d values" % MAX_NODES)
    if type(node) is not list or not node or type(node[0]) is not str:
        raise NotPlainData("not a tagged value")
    tag, n = node[0], len(node)
    if tag == "N" and n == 1:
        return True
    if tag == "B" and n == 2 and type(node[1]) is bool:
        return True
    if tag == "I" and n == 2:
        _hex_int(node[1])
        return True
    if tag == "F" and n == 2:
        _hex_float(node[1])
        return True
    if tag == "C" and n == 3:
        complex(_hex_float(node[1]), _hex_float(node[2]))
        return True
    if tag == "S" and n == 2 and type(node[1]) is str:
        return True
    if tag == "Y" and n == 2 and type(node[1]) is str:
        try:
            bytes.fromhex(node[1])
        except ValueError:
            raise NotPlainData("bad bytes payload") from None
        return True
    if tag in ("L", "T", "E", "R", "D") and n == 2 and type(node[1]) is list:
        if depth >= MAX_DEPTH:
            raise NotPlainData("containers nested deeper than %d" % MAX_DEPTH)
        if tag == "D":
            for pair in node[1]:
                if type(pair) is not list or len(pair) != 2:
                    raise NotPlainData("bad dict item")
                hashable_key = _check(pair[0], depth + 1, count)
                _check(pair[1], depth + 1, count)
                if not hashable_key:
                    raise NotPlainData("bad dict key: unhashable type")
            return False
        hashable = [_check(v, depth + 1, count) for v in node[1]]
        if tag == "L":
            return False
        if tag == "T":
            return all(hashable)
        if not all(hashable):
            raise NotPlainData("bad set element: unhashable type")
        return tag == "R"
    raise NotPlainData("unknown or malformed tag %r" % (tag[:10],))


# ---------------------------------------------------------------------------------------------------
# The wire: one JSON object per line. The sandboxed hosts use these instead of the json module, whose
# import (it pulls in `re`) costs more than the interpreter's own start-up; `_json` is the C half of json.
# The parent parses what a child sends with the real json module.

try:
    import _json
except ImportError:  # an interpreter without the C accelerator
    _json = None


class _ScanContext:
    strict = True
    object_hook = object_pairs_hook = parse_constant = None
    parse_float, parse_int = float, int
    memo = {}


def dumps(obj):
    """JSON text of a protocol message: dicts with str keys, lists, str, int, bool, None."""
    t = type(obj)
    if t is str:
        return _json.encode_basestring_ascii(obj) if _json else __import__("json").dumps(obj)
    if obj is None:
        return "null"
    if obj is True:
        return "true"
    if obj is False:
        return "false"
    if t is int:
        return int.__repr__(obj)
    if t is list or t is tuple:
        return "[" + ",".join([dumps(v) for v in obj]) + "]"
    if t is dict:
        return "{" + ",".join([dumps(str(k)) + ":" + dumps(v) for k, v in obj.items()]) + "}"
    raise TypeError("cannot send a %s" % type_name(obj))


def loads(data):
    """The message in one line of JSON (from the parent: well-formed; anything else raises ValueError)."""
    text = data.decode() if type(data) is bytes else data
    text = text.strip()
    if _json is None:
        return __import__("json").loads(text)
    try:
        value, end = _json.make_scanner(_ScanContext())(text, 0)
    except Exception:  # StopIteration, or the C scanner failing to build its error message
        raise ValueError("malformed JSON line") from None
    if end != len(text):
        raise ValueError("trailing data after the JSON value")
    return value
