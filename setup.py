"""Packaging (with pyproject.toml): the phi_api package, its data files, and the JSON Schemas of the top-level
schemas/ folder (the design card's layout) inside the wheel, as the package phi_api.schemas."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["phi_api", "phi_api.*"]), "phi_api.schemas"],
    package_dir={"phi_api.schemas": "schemas"},
    package_data={"phi_api.schemas": ["*.json"], "phi_api.api": ["static/playground/*.*", "static/playground/vendor/*"],
                  "phi_api.engine.runtime": ["data/*.txt"], "phi_api.engine.kernels": ["*.cpp", "*.h"]},
)
