// base64.js, served by pvwire at /pvws/js/base64.js: the base64 helper pages that use pvws.js
// load next to it (dbwr's view page loads both). Three globals, with the names and results pvws'
// pages expect: toByteArray(text) -> Uint8Array, fromByteArray(bytes) -> text and
// byteLength(text) -> number of bytes. URL-safe text ('-', '_') and missing padding are accepted.
"use strict";

/** The standard alphabet's form of `text`, padded to a multiple of four. */
function base64Standard(text) {
  const plain = String(text).replace(/[\s=]+/g, "").replace(/-/g, "+").replace(/_/g, "/");
  if (plain.length % 4 === 1) throw new Error("Invalid base64 string: bad length " + plain.length);
  return plain + "===".slice(0, (4 - (plain.length % 4)) % 4);
}

/** The bytes `text` encodes. */
function toByteArray(text) {
  const binary = atob(base64Standard(text));
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

/** `bytes` (a Uint8Array or an array of 0..255) as base64 text. */
function fromByteArray(bytes) {
  // String.fromCharCode takes its arguments on the stack: convert in chunks.
  const CHUNK = 0x8000;
  let binary = "";
  for (let i = 0; i < bytes.length; i += CHUNK) {
    binary += String.fromCharCode.apply(null, Array.prototype.slice.call(bytes, i, i + CHUNK));
  }
  return btoa(binary);
}

/** How many bytes `text` encodes. */
function byteLength(text) {
  const padded = base64Standard(text);
  const padding = padded.endsWith("==") ? 2 : padded.endsWith("=") ? 1 : 0;
  return (padded.length / 4) * 3 - padding;
}
