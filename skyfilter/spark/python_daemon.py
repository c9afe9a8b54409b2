"""The Python worker daemon of skyfilter's Spark jobs: pyspark's own, started without Spark's archives on its path.

Spark puts ``pyspark.zip``, the py4j zip and the ``spark-core`` jar (15 MB, thousands
of entries) at the front of every Python worker's ``sys.path``, and the worker calls
``importlib.invalidate_caches()`` at the start of every task, which makes Python
re-read the whole directory of each zip it imports from.  Measured on the delivery
lane with the demo's two Python filters: 92% of a warm worker's busy time went to
re-reading those directories, about 0.1 s per task, on every micro-batch.  Where
pyspark and py4j are installed as packages (pip, this project's venv and image),
the archives are duplicates: this daemon drops them before pyspark is imported and
then runs pyspark's daemon unchanged.  Where the archives are the only copy (a
cluster whose workers have no pyspark package), nothing is dropped.

Spark starts it through ``spark.python.daemon.module`` (``conf/spark-defaults.conf``).
"""

from __future__ import annotations

import os
import sys


def installed_as_packages(paths: list[str], packages: tuple[str, ...] = ("pyspark", "py4j")) -> bool:
    """Whether each of ``packages`` is a plain folder in some folder of ``paths``."""
    folders = [p for p in paths if os.path.isdir(p)]
    return all(any(os.path.isfile(os.path.join(folder, name, "__init__.py")) for folder in folders)
               for name in packages)


def is_spark_archive(path: str) -> bool:
    """Whether ``path`` is one of the archives Spark puts on a worker's path: ``pyspark.zip``, the py4j zip,
    a jar.  A user's own zip (``--py-files``) is not one of them."""
    name = os.path.basename(path)
    return os.path.isfile(path) and (name == "pyspark.zip" or name.endswith(".jar")
                                     or (name.startswith("py4j-") and name.endswith(".zip")))


def without_archives(paths: list[str]) -> list[str]:
    """``paths`` without Spark's archives on it, when pyspark and py4j are installed as packages."""
    if not installed_as_packages(paths):
        return list(paths)
    return [p for p in paths if not is_spark_archive(p)]


def main() -> None:
    """Drop the archives from this process's import path, then run pyspark's daemon."""
    kept = without_archives(sys.path)
    for path in set(sys.path) - set(kept):
        sys.path_importer_cache.pop(path, None)
    sys.path[:] = kept
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
