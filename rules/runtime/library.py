"""Several bundles (one per arch): load the kernel a caller asks for, built for the GPU in front of it."""
from __future__ import annotations

from pathlib import Path

from .bundle import Bundle, BundleError, NoMatchingKernel, matches
from .device import runnable_archs
from .schema import arch_of_bundle_file, few


class Library:
    """Bundles from wheel/zip files, bundle directories, or directories of wheels (such as out/dist/). A bundle is
    opened only when a request needs its arch, as its file name tells: loading one kernel reads one manifest."""

    def __init__(self, *paths):
        self._paths: list[Path] = []
        for p in map(Path, paths):
            if p.is_dir() and not (p / "manifest.json").exists():
                wheels = sorted(p.glob("*.whl"))
                if not wheels:
                    raise BundleError(f"{p}: no bundle here (no manifest.json, no *.whl); run `doit package`")
                by_arch: dict[str | None, list[str]] = {}
                for w in wheels:
                    by_arch.setdefault(arch_of_bundle_file(w.name), []).append(w.name)
                twice = {a: names for a, names in by_arch.items() if a is not None and len(names) > 1}
                if twice:   # which one a request gets would be the order of their digests: never a silent pick
                    arch, names = next(iter(twice.items()))
                    raise BundleError(f"{p}: {len(names)} bundles for {arch} ({', '.join(names)}); a folder of "
                                      f"wheels holds one per arch, as `doit package` leaves out/dist: remove the "
                                      f"others, or name the wheel to load")
                self._paths += wheels
            else:
                self._paths.append(p)
        self._opened: dict[Path, Bundle] = {}

    @property
    def bundles(self) -> list[Bundle]:
        return [self._open(p) for p in self._paths]

    def load_for_shape(self, kernel: str, shape: dict[str, int], where: dict | None = None, *, device: int = 0,
                       arch: str | None = None):
        """The kernel in the config its bundle's tuning table picks for `shape` (arg name -> size) and the
        `where` values (e.g. {"dtype": "bf16"})."""
        described, archs = (arch, [arch]) if arch else runnable_archs(device)
        bundles = self.bundles_for(archs)
        if not bundles:
            raise NoMatchingKernel(f"no bundle for {described} (it runs {', '.join(archs)})")
        entry, _ = bundles[0].find_for_shape(kernel, shape, where)
        return bundles[0].kernel(entry)

    def bundles_for(self, archs: list[str]) -> list[Bundle]:
        """The bundles for these archs, in the order given (best first)."""
        return [self._open(p) for a in archs for p in self._paths if arch_of_bundle_file(p.name) in (a, None)
                if self._open(p).arch == a]

    def load(self, kernel: str, config: dict | str | None = None, *, device: int = 0, arch: str | None = None,
             jit_fallback: bool = False):
        """The kernel for this device's arch (or `arch`), from the first bundle that can run there. jit_fallback=True:
        a kernel no bundle has for this device is JIT-compiled by Triton from its source, which needs the checkout
        the bundle was built from on sys.path and matching the digests the bundle recorded (jit.import_checked)."""
        try:
            bundle, entry = self.select(kernel, config, device=device, arch=arch)
        except NoMatchingKernel:
            if not jit_fallback:
                raise
            from .jit import JitKernel
            return JitKernel(self._recipe(kernel, config))
        return bundle.kernel(entry)

    def select(self, kernel: str, config: dict | str | None = None, *, device: int = 0,
               arch: str | None = None) -> tuple[Bundle, dict]:
        """(bundle, manifest entry) for the request; NoMatchingKernel says what the bundles have instead."""
        described, archs = (arch, [arch]) if arch else runnable_archs(device)
        error = None
        for bundle in self.bundles_for(archs):
            try:
                return bundle, bundle.find(kernel, config)
            except NoMatchingKernel as e:
                error = error or e
        if error is not None:
            raise error
        have = few(f"{b.arch} ({b.path.name})" for b in self.bundles)
        raise NoMatchingKernel(f"no bundle for {described}: it runs {', '.join(archs)}; the bundles are for {have}. "
                               f"Build and package that arch (`doit package archs={archs[0]}`), or pass "
                               f"jit_fallback=True to compile {kernel} with Triton at run time")

    def _open(self, path: Path) -> Bundle:
        if path not in self._opened:
            bundle = Bundle(path)
            named = arch_of_bundle_file(path.name)
            if named not in (None, bundle.arch):
                raise BundleError(f"{path}: the name says {named}, its manifest says {bundle.arch}; "
                                  f"was it renamed? Use the file `doit package` wrote")
            self._opened[path] = bundle
        return self._opened[path]

    def _recipe(self, kernel: str, config) -> dict:
        """How the kernel was built for some arch: its source, constexprs and options (same on every arch)."""
        for b in self.bundles:
            for e in b.artifacts + b.failed:
                if isinstance(e, dict) and e.get("kernel") == kernel and matches(e, config) and "source" in e:
                    return e
        raise NoMatchingKernel(f"{kernel} {config!r}: no bundle knows this kernel and config, so there is "
                               f"nothing to JIT-compile either")
