"""The package version, on the lowest floor: records, bundles and reports stamp it, and none of them may
import the package root (which sits on the top floor, above every stage)."""

__version__ = "0.1.0"
