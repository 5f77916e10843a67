"""Kernels written as text: ``"rbf + periodic(period=1) * rbf + rq + white"``.

Grammar (``*`` binds tighter than ``+``; parentheses group)::

    sum     := product ('+' product)*
    product := factor ('*' factor)*
    factor  := KIND ['(' [argument (',' argument)*] ')'] | '(' sum ')'
    argument:= NAME '=' NUMBER | NAME '=' 'fixed' '(' NUMBER ')' | 'ard'
             | 'dims' '=' INTEGER | 'dims' '=' '[' INTEGER (',' INTEGER)* ']'

KIND is a name of :data:`~pyrogp_models.kernels.registry.KINDS` (``rbf``, ``matern12``,
``matern32``, ``matern52``, ``rq``, ``periodic``, ``linear``, ``constant``, ``white``); NAME a
hyperparameter of that kind. Values are initial values **in data units** (a period of 1 on an
axis in years is a year); ``fixed(v)`` holds a value; ``ard`` gives a value per input dimension;
``dims`` selects the input columns (0-based; default: all). An error names the offending token
and its position in one line.
"""

from __future__ import annotations

import re

import torch

from pyrogp_models.kernels.base import Kernel, Product, Sum
from pyrogp_models.kernels.registry import HYPERPARAMETERS, KINDS

_TOKEN = re.compile(r"\s*(?:(?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
                    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<symbol>[+*(),=\[\]]))")


class KernelExpressionError(ValueError):
    """A kernel expression that does not parse; the message points at the token."""


class _Parser:
    def __init__(self, text: str, input_dim: int, ard: bool):
        self.text, self.input_dim, self.ard = text, input_dim, ard
        self.tokens: list[tuple[str, str, int]] = []
        position = 0
        while position < len(text):
            match = _TOKEN.match(text, position)
            if match is None or match.end() == position:
                if not text[position:].strip():
                    break
                start = position + len(text[position:]) - len(text[position:].lstrip())
                raise self.error(f"unexpected character '{text[start]}'", start)
            kind = match.lastgroup
            self.tokens.append((kind, match.group(kind), match.start(kind)))
            position = match.end()
        self.index = 0

    def error(self, message: str, position: int | None = None) -> KernelExpressionError:
        if position is None:
            position = self.tokens[self.index][2] if self.index < len(self.tokens) \
                else len(self.text)
        return KernelExpressionError(f'cannot read the kernel "{self.text}": {message} at '
                                     f"character {position + 1}")

    def peek(self) -> tuple[str, str, int] | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def take(self, what: str) -> tuple[str, str, int]:
        """The next token, whatever it is (``what`` names the expected thing in an error)."""
        token = self.peek()
        if token is None:
            raise self.error(f"expected {what}, the expression ended")
        self.index += 1
        return token

    def expect(self, symbol: str) -> None:
        """Consume ``symbol`` or fail naming it."""
        token = self.take(f"'{symbol}'")
        if token[1] != symbol:
            self.index -= 1
            raise self.error(f"expected '{symbol}', found '{token[1]}'")

    def parse(self) -> Kernel:
        if not self.tokens:
            raise self.error("empty expression", 0)
        kernel = self.sum()
        if self.peek() is not None:
            raise self.error(f"unexpected '{self.peek()[1]}'")
        return kernel

    def sum(self) -> Kernel:
        terms = [self.product()]
        while self.peek() is not None and self.peek()[1] == "+":
            self.expect("+")
            terms.append(self.product())
        return terms[0] if len(terms) == 1 else Sum(terms)

    def product(self) -> Kernel:
        factors = [self.factor()]
        while self.peek() is not None and self.peek()[1] == "*":
            self.expect("*")
            factors.append(self.factor())
        return factors[0] if len(factors) == 1 else Product(factors)

    def factor(self) -> Kernel:
        kind, value, position = self.take("a kernel name")
        if value == "(":
            kernel = self.sum()
            self.expect(")")
            return kernel
        if kind != "name":
            raise self.error(f"expected a kernel name, found '{value}'", position)
        name = value.lower()
        if name not in KINDS:
            raise self.error(f"unknown kernel '{value}' (known: {', '.join(sorted(KINDS))})",
                             position)
        options = {"values": {}, "fixed": [], "ard": False, "dims": None}
        if self.peek() is not None and self.peek()[1] == "(":
            self.expect("(")
            if self.peek() is not None and self.peek()[1] == ")":
                self.expect(")")
            else:
                self.argument(name, options)
                while self.peek() is not None and self.peek()[1] == ",":
                    self.expect(",")
                    self.argument(name, options)
                self.expect(")")
        dims = options["dims"] if options["dims"] is not None else list(range(self.input_dim))
        for dim in dims:
            if not 0 <= dim < self.input_dim:
                raise self.error(f"'{value}' uses input column {dim}, but the data have "
                                 f"{self.input_dim}", position)
        try:
            return KINDS[name](len(dims), active_dims=dims, ard=options["ard"] or self.ard,
                               fixed=options["fixed"], dtype=torch.float64,
                               **options["values"])
        except ValueError as error:
            raise self.error(str(error), position) from None

    def argument(self, kind: str, options: dict) -> None:
        _, name, position = self.take("an argument")
        if name == "ard":
            options["ard"] = True
            return
        self.expect("=")
        if name == "dims":
            options["dims"] = self.integers()
            return
        token = self.peek()
        if token is not None and token[1] == "fixed":
            self.expect("fixed")
            self.expect("(")
            number = self.number()
            self.expect(")")
            options["fixed"].append(name)
        else:
            number = self.number()
        hyperparameters = [h.name for h in HYPERPARAMETERS[kind]]
        if name not in hyperparameters:
            raise self.error(f"'{kind}' has no '{name}' (it has {', '.join(hyperparameters)}, "
                             "ard, dims)", position)
        options["values"][name] = number

    def number(self) -> float:
        kind, value, position = self.take("a number")
        if kind != "number":
            raise self.error(f"expected a number, found '{value}'", position)
        return float(value)

    def integers(self) -> list[int]:
        if self.peek() is not None and self.peek()[1] == "[":
            self.expect("[")
            values = [self.integer()]
            while self.peek() is not None and self.peek()[1] == ",":
                self.expect(",")
                values.append(self.integer())
            self.expect("]")
            return values
        return [self.integer()]

    def integer(self) -> int:
        kind, value, position = self.take("an input column")
        if kind != "number" or not re.fullmatch(r"\d+", value):
            raise self.error(f"expected an input column (0, 1, ...), found '{value}'", position)
        return int(value)


def parse_kernel(text: str, input_dim: int, ard: bool = False) -> Kernel:
    """The kernel written in ``text`` (module docstring) for inputs of ``input_dim`` columns
    (``ard``: every leaf with one value per dimension); its values are in data units, float64,
    unbatched. Raises :class:`KernelExpressionError`."""
    return _Parser(text, input_dim, ard).parse()
