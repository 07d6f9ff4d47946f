#!/usr/bin/env bash
# Headless Chromium and ChromeDriver for the test that opens the rendered book in a browser.
# Installed from Debian's packages where missing and where we can (root and apt-get); otherwise the
# browser test is skipped with a message saying so.
set -u
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "Installing Debian packages chromium and chromium-driver for the browser test..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null \
    && exit 0
  echo "warning: could not install chromium; the browser test will be skipped" >&2
else
  echo "note: chromium/chromedriver not found and cannot be installed here (needs root and apt-get);" \
       "the browser test will be skipped" >&2
fi
exit 0
