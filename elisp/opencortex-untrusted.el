;;; opencortex-untrusted.el --- Text from the kernel made inert  -*- lexical-binding: t; -*-

;; This file is part of opencortex.
;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; What the kernel sends may hold what a model wrote, and a model's text is
;; untrusted: before it reaches a buffer, control characters (an ESC
;; starting a terminal sequence, a CR that would hide what came before it,
;; bidi overrides that reorder what is read) become visible symbols
;; (`opencortex--visible'), and text the model wrote inside a line the
;; kernel drew becomes one line with no org links (`opencortex--inert-line').

;;; Code:

(require 'subr-x)

(declare-function org-link-types "ol" ())

(defconst opencortex--control-regexp
  (rx (any (0 . 8) (11 . 31) 127 (#x80 . #x9f) (#x202a . #x202e) (#x2066 . #x2069)))
  "Characters that must not reach the buffer as they are.
C0 controls except tab and newline, DEL, C1 controls, and the bidi
embeddings, overrides and isolates.")

(defun opencortex--visible-char (char)
  "The visible stand-in for the control character CHAR."
  (cond ((< char 32) (string (+ #x2400 char)))
        ((= char 127) (string #x2421))
        (t (format "⟨U+%04X⟩" char))))

(defun opencortex--visible (text)
  "TEXT with its control characters made visible.
A C0 control other than tab and newline shows as its Unicode control
picture (ESC as ␛, CR as ␍), DEL as ␡; a C1 control or a bidi override
or isolate as ⟨U+XXXX⟩.  Nothing then reaches the buffer (or a terminal
showing it) that moves the cursor, hides text or reorders it; the
function is idempotent."
  (if (string-match-p opencortex--control-regexp text)
      (replace-regexp-in-string
       opencortex--control-regexp
       (lambda (match) (opencortex--visible-char (aref match 0)))
       text t t)
    text))

(defun opencortex--break-links (text)
  "TEXT with nothing org would read as a link.
`[[' and `]]' get a zero-width space between their brackets, and so does
the colon after the name of a link type (\"elisp:\", \"shell:\",
\"file:\"..., in any case) that could start a plain or angle link."
  (let* ((case-fold-search t)
         (types (delete-dups (append '("elisp" "shell" "file" "help" "info")
                                     (and (fboundp 'org-link-types) (org-link-types)))))
         (text (replace-regexp-in-string "\\[\\[" "[\u200b[" text t t))
         (text (replace-regexp-in-string "]]" "]\u200b]" text t t)))
    (replace-regexp-in-string (concat "\\(" (regexp-opt types) "\\):") "\\1\u200b:" text t)))

(defun opencortex--one-line (text &optional limit)
  "TEXT as one line: newlines become ␤, tabs spaces, controls visible.
With LIMIT, text longer than LIMIT characters is cut there and ends
with \"…\"."
  (let* ((text (replace-regexp-in-string "\r?\n" "␤" text t t))
         (text (replace-regexp-in-string "\t" " " text t t))
         (text (opencortex--visible text)))
    (if (and limit (> (length text) limit))
        (concat (substring text 0 limit) "…")
      text)))

(defun opencortex--inert-line (text &optional limit)
  "TEXT as one inert line: safe inside a line of org text the kernel drew.
It is `opencortex--one-line' (with LIMIT) with its org links broken (see
`opencortex--break-links')."
  (opencortex--break-links (opencortex--one-line text limit)))

(provide 'opencortex-untrusted)
;;; opencortex-untrusted.el ends here
