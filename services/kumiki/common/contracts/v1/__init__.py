"""Generated from proto/kumiki/v1 by kumiki.common.contracts.codegen; do not edit."""
