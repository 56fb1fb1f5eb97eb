;;; opencortex-chat.el --- The *opencortex-chat* buffer  -*- lexical-binding: t; -*-

;; This file is part of opencortex.  License: GPL-3.0-or-later.

;;; Commentary:

;; The chat buffer and everything that writes into it: an org-mode buffer
;; whose transcript is read-only and whose input area sits at the end, after
;; a prompt line.  Output from the kernel is always inserted before the
;; prompt, at `opencortex--output-marker', so the person's point and the text
;; they are typing never move.
;;
;; Nothing here talks to the kernel directly: every outgoing call goes through
;; `opencortex--request', which calls `opencortex--call-function' (the EPC
;; connection in opencortex.el; a recorder in the tests).

;;; Code:

(require 'cl-lib)
(require 'org)
(require 'subr-x)

;;;; Options

(defcustom opencortex-chat-buffer-name "*opencortex-chat*"
  "Name of the chat buffer."
  :type 'string
  :group 'opencortex)

(defcustom opencortex-chat-id "main"
  "Chat id of the Emacs chat; the kernel's thread is \"emacs:<id>\"."
  :type 'string
  :group 'opencortex)

(defcustom opencortex-prompt "* Message  (C-c RET sends, C-c C-k aborts)\n"
  "Read-only line before the input area; it should end with a newline."
  :type 'string
  :group 'opencortex)

(defcustom opencortex-after-insert-hook nil
  "Functions called with (BEG END) after opencortex changed a buffer.
They run with that buffer current, once per buffer update (a coalesced
batch of streamed text counts as one update)."
  :type 'hook
  :group 'opencortex)

(defface opencortex-error-face
  '((t :inherit error))
  "Face of errors shown in the chat buffer."
  :group 'opencortex)

;;;; State shared by the chat files

(defvar opencortex--call-function 'opencortex--call
  "Function that sends one call to the kernel.
Called as (METHOD ARGS ON-SUCCESS ON-ERROR): METHOD a symbol, ARGS a
list, ON-SUCCESS called with the result, ON-ERROR with a message string
\(either may be nil).  Tests bind it to record calls instead.")

(defvar opencortex--status nil
  "The latest status plist from the kernel (see `opencortex--format-header').")

(defvar opencortex--kernel-state nil
  "State of the kernel connection, for the header line.
One of nil, `starting', `authenticating', `ready', `dead', `stopped', `failed'.")

(defvar opencortex--thread nil
  "Thread of the chat as the kernel named it (\"emacs:main\").")

(defvar-local opencortex--output-marker nil
  "Where output goes: the end of the transcript, just before the prompt.")

(defvar-local opencortex--input-marker nil
  "Start of the input area (after the prompt); it runs to the end of the buffer.")

(defvar-local opencortex--last-output-kind nil
  "Kind of the latest output: `insert' (kernel text), `stream', or ours.")

(defun opencortex--request (method args &optional on-success on-error)
  "Send METHOD with ARGS to the kernel through `opencortex--call-function'.
ON-SUCCESS gets the result; ON-ERROR a message (default: shown in the buffer)."
  (let ((call opencortex--call-function))
    (when (and (symbolp call) (not (fboundp call)))
      (require 'opencortex))
    (funcall call method args on-success on-error)))

;;;; The buffer

(defvar opencortex-chat-mode-map
  (let ((map (make-sparse-keymap)))
    (define-key map (kbd "C-c RET") 'opencortex-send)
    (define-key map (kbd "C-c C-k") 'opencortex-abort)
    (define-key map (kbd "C-c C-a") 'opencortex-approve)
    (define-key map (kbd "C-c C-d") 'opencortex-deny)
    map)
  "Keymap of `opencortex-chat-mode'.")

(define-derived-mode opencortex-chat-mode org-mode "opencortex"
  "Chat with the opencortex kernel.
Type below the prompt; \\[opencortex-send] sends (a line starting with
/ is a slash command), \\[opencortex-abort] aborts the running turn,
\\[opencortex-approve] and \\[opencortex-deny] answer the latest approval.

\\{opencortex-chat-mode-map}"
  (setq-local header-line-format '(:eval (opencortex--header-line)))
  (opencortex--setup-input-area))

(defun opencortex--chat-buffer ()
  "The chat buffer, created and set up when missing."
  (let ((buffer (get-buffer-create opencortex-chat-buffer-name)))
    (with-current-buffer buffer
      (unless (and (derived-mode-p 'opencortex-chat-mode)
                   (markerp opencortex--input-marker))
        (opencortex-chat-mode)))
    buffer))

(defun opencortex--read-only (text &optional face)
  "TEXT as transcript: read-only, in FACE when non-nil."
  (let ((text (copy-sequence text)))
    (add-text-properties 0 (length text) '(read-only t front-sticky (read-only)) text)
    (when face
      (add-text-properties 0 (length text) (list 'face face 'font-lock-face face) text))
    text))

(defun opencortex--setup-input-area ()
  "Put the prompt at the end of the buffer and the markers around it."
  (let ((inhibit-read-only t)
        (prompt (opencortex--read-only opencortex-prompt)))
    (put-text-property (1- (length prompt)) (length prompt) 'rear-nonsticky t prompt)
    (save-excursion
      (goto-char (point-max))
      (unless (bolp) (insert (opencortex--read-only "\n")))
      (add-text-properties (point-min) (point) '(read-only t front-sticky (read-only)))
      (setq opencortex--output-marker (point-marker))
      (insert prompt)
      (set-marker-insertion-type opencortex--output-marker t)
      (setq opencortex--input-marker (point-marker))))
  (goto-char (point-max)))

(defun opencortex--input-text ()
  "The text in the input area."
  (with-current-buffer (opencortex--chat-buffer)
    (buffer-substring-no-properties opencortex--input-marker (point-max))))

(defun opencortex--take-input ()
  "Remove and return the text of the input area."
  (with-current-buffer (opencortex--chat-buffer)
    (prog1 (opencortex--input-text)
      (delete-region opencortex--input-marker (point-max)))))

(defun opencortex--restore-input (text)
  "Put TEXT back into the input area when the person has not typed anything new."
  (with-current-buffer (opencortex--chat-buffer)
    (when (string-empty-p (string-trim (opencortex--input-text)))
      (save-excursion
        (delete-region opencortex--input-marker (point-max))
        (goto-char opencortex--input-marker)
        (insert text)))))

;;;; Writing output

(defun opencortex--with-output (function)
  "Call FUNCTION in the chat buffer with point at the output position.
Read-only text may be changed; point, windows and the input area stay
where they are.  Output is not undoable and clears the undo list (the
positions it holds would be stale)."
  (with-current-buffer (opencortex--chat-buffer)
    (let ((inhibit-read-only t)
          (undo-enabled (not (eq buffer-undo-list t))))
      (prog1 (let ((buffer-undo-list t))
               (save-excursion
                 (goto-char opencortex--output-marker)
                 (funcall function)))
        (when undo-enabled (setq buffer-undo-list nil))))))

(defun opencortex--changed (beg end)
  "Run `opencortex-after-insert-hook' for BEG..END of the current buffer."
  (run-hook-with-args 'opencortex-after-insert-hook beg end))

(defun opencortex--fresh-line ()
  "Start a new line at point unless point is at the beginning of one."
  (unless (bolp) (insert (opencortex--read-only "\n"))))

(defun opencortex--output (text &optional face kind)
  "Insert TEXT at the end of the transcript; return its end position.
FACE colours it.  Text starts on a line of its own, except kernel text
\(KIND `insert') that continues the previous kernel text: a long text the
kernel split in pieces arrives exactly as it was.  A heading (\"* \")
always starts a line."
  (opencortex--with-output
   (lambda ()
     (unless (and (eq kind 'insert) (eq opencortex--last-output-kind 'insert)
                  (not (string-prefix-p "* " text)))
       (opencortex--fresh-line))
     (let ((beg (point)))
       (insert (opencortex--read-only text face))
       (setq opencortex--last-output-kind (or kind 'block))
       (opencortex--changed beg (point))
       (point)))))

(defun opencortex--ensure-newline (text)
  "TEXT ending with a newline."
  (if (string-suffix-p "\n" text) text (concat text "\n")))

(defun opencortex--show-error (text)
  "Show TEXT in the chat buffer as an error."
  (opencortex--output (opencortex--ensure-newline (concat "Error: " text))
                      'opencortex-error-face 'error))

(defun opencortex--show-note (text)
  "Show TEXT in the chat buffer as a note from opencortex itself."
  (opencortex--output (opencortex--ensure-newline text) 'shadow 'note))

;;;; Methods the kernel calls (each returns t)

(defun opencortex--check-string (value what)
  "Signal an error unless VALUE, the argument WHAT, is a string."
  (unless (stringp value)
    (error "opencortex: %s must be a string, got %S" what (type-of value))))

(defun opencortex--handle-insert (buffer text)
  "Method `opencortex-insert': insert TEXT at the end of BUFFER.
In the chat buffer the text goes before the input area."
  (opencortex--check-string buffer "buffer")
  (opencortex--check-string text "text")
  (if (equal buffer opencortex-chat-buffer-name)
      (opencortex--output text nil 'insert)
    (with-current-buffer (get-buffer-create buffer)
      (when buffer-read-only
        (error "opencortex: buffer %s is read-only" buffer))
      (save-excursion
        (goto-char (point-max))
        (let ((beg (point)))
          (insert text)
          (opencortex--changed beg (point))))))
  t)

(defun opencortex--handle-show-error (text)
  "Method `opencortex-show-error': show TEXT as an error in the chat buffer."
  (opencortex--check-string text "text")
  (opencortex--show-error text)
  t)

;;;; Status and the header line

(defun opencortex--set-status (status)
  "Remember STATUS (a plist from the kernel) and redraw the header line."
  (when (and (listp status) (keywordp (car-safe status)))
    (setq opencortex--status status))
  (opencortex--update-header))

(defun opencortex--update-header ()
  "Redraw the chat buffer's header line."
  (let ((buffer (get-buffer opencortex-chat-buffer-name)))
    (when buffer
      (with-current-buffer buffer (force-mode-line-update)))))

(defun opencortex--number (value format-string)
  "VALUE formatted with FORMAT-STRING, or \"-\" when it is not a number."
  (if (numberp value) (format format-string value) "-"))

(defun opencortex--format-header (status state)
  "The header text for STATUS (a plist) and connection STATE (a symbol).
STATUS holds :turn, :context-percent, :cost-usd, :latency-ms (average),
:backend and :warning."
  (let ((parts (list (if (memq state '(ready nil))
                         "opencortex"
                       (format "opencortex [%s]" state)))))
    (when status
      (push (concat "turn " (opencortex--number (plist-get status :turn) "%d")) parts)
      (push (concat "context " (opencortex--number (plist-get status :context-percent) "%.1f")
                    "%")
            parts)
      (push (concat "$" (opencortex--number (plist-get status :cost-usd) "%.4f")) parts)
      (push (concat "avg " (opencortex--number (plist-get status :latency-ms) "%.0f") " ms")
            parts)
      (let ((backend (plist-get status :backend)))
        (when (stringp backend) (push backend parts)))
      (let ((warning (plist-get status :warning)))
        (when (and (stringp warning) (not (string-empty-p warning)))
          (push (propertize warning 'face 'warning) parts))))
    (mapconcat #'identity (nreverse parts) " | ")))

(defun opencortex--header-line ()
  "The header line of the chat buffer (with `%' escaped for the mode line)."
  (replace-regexp-in-string
   "%" "%%" (opencortex--format-header opencortex--status opencortex--kernel-state) t t))

(defun opencortex--refresh-status ()
  "Ask the kernel for the status; the header line follows."
  (opencortex--request 'status (list opencortex-chat-id) #'opencortex--set-status #'ignore))

(provide 'opencortex-chat)
;;; opencortex-chat.el ends here
