"""Small helpers every part uses: console output and progress, build-once file locks."""
