"""skyfilter: streaming filters for astronomical alert streams (Kafka + Spark + Delta)."""

import importlib.util
from pathlib import Path

from setuptools import find_packages, setup

# The pins live in skyfilter/defaults/versions.env (conf/versions.env in a checkout); read them with the
# package's own reader, loaded alone (the package's dependencies are not installed yet).
_spec = importlib.util.spec_from_file_location(
    "skyfilter_versions", Path(__file__).resolve().parent / "skyfilter" / "core" / "versions.py")
_versions = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_versions)
VERSIONS = _versions.versions()

setup(
    name="skyfilter",
    version="0.1.0",
    description="Streaming filter stage for astronomical alert streams (Rubin/LSST, ZTF)",
    python_requires=">=3.11",
    # One package; its folders are its floors: core <- spark, producers <- filtering <- plan <- lanes <- delivery,
    # archive <- jobs, tools <- the command (cli, demo) (docs/architecture.md, "Code").
    # pipelines/ and producers/ at the top hold only thin scripts; bench/ runs from a checkout.
    packages=find_packages(include=["skyfilter", "skyfilter.*"]),
    package_data={"skyfilter": ["defaults/*.yaml", "defaults/*.env", "spark/jvm/*.java"]},
    install_requires=[
        f"pyspark=={VERSIONS['SPARK_VERSION']}",
        f"delta-spark=={VERSIONS['DELTA_VERSION']}",
        "astropy==7.1.1",  # sky geometry of watchlists and watchmaps: the field's libraries, not our own
        "astropy-healpix==2.0.1",
        "pyerfa==2.0.1.5",  # ERFA (SOFA) unit vectors of positions: fast on one alert, as Real-time Mode asks
        "mocpy==0.21.0",
        "scipy==1.17.1",  # the KD-tree a watchlist is searched with
        "confluent-kafka[avro]==2.16.1",  # with its schema registry client, AvroSerializer, AvroDeserializer
        "fastavro==1.13.1",
        "deltalake==1.6.6",  # the archive's alerts appended without Spark (archive.writer: delta-rs)
        "duckdb==2.0.1",  # which evaluates the alert id, time and visit expressions there
        "lsst-alert-packet==30.2026.2700",
        "matplotlib==3.11.2",
        "numpy==2.3.5",
        "pandas==2.3.3",
        "pyarrow==21.0.0",
        "prometheus-client==0.26.0",
        "psutil==7.2.2",
        "pyyaml==6.0.3",
        "tqdm==4.67.1",
    ],
    extras_require={
        "test": ["pytest==8.4.2", "pytest-xdist==3.8.0", "ruff==0.14.5", "ipykernel==7.4.0", "nbclient==0.11.0",
                 "nbformat==5.11.1",
                 # the community brokers' own clients, which the encodings are tested with
                 "fink-client==12.3.0", "lasair==0.1.4",
                 "mkdocs==1.6.1"],  # the docs site, built --strict by the tests
        "notebook": ["jupyterlab==4.6.6", "ipykernel==7.4.0"],
    },
    entry_points={"console_scripts": ["skyfilter=skyfilter.cli:main"]},
)
