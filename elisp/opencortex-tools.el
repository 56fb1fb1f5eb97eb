;;; opencortex-tools.el --- What the kernel's Emacs tools do in Emacs  -*- lexical-binding: t; coding: utf-8 -*-

;; This file is part of opencortex.
;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; The kernel's bundled Emacs tools (skills/emacs-tools.org) reach Emacs
;; through the methods in `opencortex--tool-methods', one small method
;; per job.  This file has those on buffers: describe the buffers, read a
;; buffer, show the lines around a change (for the diff an approval
;; shows), insert, replace; opencortex-tools-org.el has those on org files:
;; file a note, list agenda entries, show a file.
;;
;; Each method answers a plist.  A failure the model can act on (no such
;; buffer, a read-only buffer, text that occurs twice) is answered as
;; (:error MESSAGE): the model reads a sentence, not a Lisp error.
;;
;; The methods run from the EPC process filter, so they never ask
;; anything: no minibuffer, no local-variables query (only safe local
;; variables apply), no question about a file locked elsewhere or changed
;; on disk (that is an error instead), and no window is selected (a file
;; shown for the person appears in another window; the chat input keeps
;; the focus).  Text the model wrote reaches a buffer only through
;; `opencortex--visible'.  No method evaluates anything it is sent.

;;; Code:

(require 'cl-lib)
(require 'subr-x)
(require 'opencortex-chat)

(defcustom opencortex-tools-max-chars 200000
  "Most characters a tool reads from or writes into a buffer in one call."
  :type 'natnum
  :group 'opencortex)

(defcustom opencortex-tools-context-lines 3
  "Lines of context around a change shown when the kernel asks for approval."
  :type 'natnum
  :group 'opencortex)

(defconst opencortex--tool-methods
  '((opencortex-tool-list-buffers opencortex--tool-list-buffers "(LIMIT)"
                                  "Describe at most LIMIT live buffers.")
    (opencortex-tool-read-buffer opencortex--tool-read-buffer "(BUFFER REGION MAX-CHARS)"
                                 "The text of BUFFER (or of its active region).")
    (opencortex-tool-around opencortex--tool-around "(BUFFER AT OLD)"
                            "The lines around where a change would go.")
    (opencortex-tool-insert opencortex--tool-insert "(BUFFER TEXT AT)"
                            "Insert TEXT into BUFFER at its end, point or start.")
    (opencortex-tool-replace opencortex--tool-replace "(BUFFER OLD NEW)"
                             "Replace the one occurrence of OLD in BUFFER with NEW.")
    (opencortex-tool-capture opencortex--tool-capture "(FILE HEADING TEXT)"
                             "File a note as an org entry at the end of FILE.")
    (opencortex-tool-agenda opencortex--tool-agenda "(FROM TO LIMIT)"
                            "Agenda entries from FROM to TO, at most LIMIT.")
    (opencortex-tool-open opencortex--tool-open "(FILE HEADING)"
                          "Show FILE (at the org HEADING) in another window."))
  "The methods the kernel's Emacs tools call: (NAME FUNCTION ARGS DOC).
The last three are in opencortex-tools-org.el.")

;;;; Shared pieces

(defmacro opencortex--tool-answer (&rest body)
  "Run BODY; its value, or (:error MESSAGE) when it signals an error."
  (declare (indent 0) (debug t))
  `(condition-case err
       (progn ,@body)
     (error (list :error (error-message-string err)))))

(defun opencortex--tool-find-file (file)
  "Visit FILE without asking anything and return its buffer.
Only safe local variables apply, and a large file is no question."
  (let ((enable-local-variables :safe)
        (enable-local-eval nil)
        (large-file-warning-threshold nil))
    (find-file-noselect file t)))

(defun opencortex--tool-buffer (name)
  "The live buffer called NAME, or an error saying there is none."
  (opencortex--check-string name "buffer")
  (or (get-buffer name)
      (error "No buffer is called %s (emacs-list-buffers lists them)"
             (opencortex--one-line name 200))))

(defun opencortex--tool-limit (value)
  "VALUE as a character count, at most `opencortex-tools-max-chars'."
  (if (and (natnump value) (> value 0))
      (min value opencortex-tools-max-chars)
    opencortex-tools-max-chars))

(defun opencortex--tool-check-writable (buffer)
  "Signal an error unless a tool may change BUFFER without asking anything.
The chat buffer is written by replies only; a read-only buffer, a file
changed on disk since it was read, or a file locked by another Emacs
would need a question, so they are errors."
  (with-current-buffer buffer
    (when (equal (buffer-name) opencortex-chat-buffer-name)
      (error "The chat buffer is written by replies, not by tools"))
    (when buffer-read-only
      (error "Buffer %s is read-only" (buffer-name)))
    (when buffer-file-name
      (unless (verify-visited-file-modtime buffer)
        (error "%s changed on disk since Emacs read it; revert the buffer first"
               buffer-file-name))
      (let ((owner (file-locked-p buffer-file-name)))
        (when (stringp owner)
          (error "%s is being edited elsewhere (locked by %s)" buffer-file-name owner))))))

(defun opencortex--tool-point (buffer)
  "Point of BUFFER as the person sees it: its window's point when it is shown."
  (let ((window (get-buffer-window buffer t)))
    (if window (window-point window) (with-current-buffer buffer (point)))))

(defun opencortex--tool-position (buffer at)
  "Where AT (\"end\", \"point\" or \"start\") is in BUFFER, ignoring narrowing."
  (with-current-buffer buffer
    (pcase at
      ("end" (1+ (buffer-size)))
      ("start" 1)
      ("point" (opencortex--tool-point buffer))
      (_ (error "Where to insert must be \"end\", \"point\" or \"start\", not %s"
                (opencortex--one-line (format "%S" at) 40))))))

(defun opencortex--tool-find-once (old)
  "Start of the one occurrence of OLD in the current buffer (case matters).
An error when OLD is empty, missing, or occurs more than once
\(overlapping occurrences count)."
  (opencortex--check-string old "old")
  (when (string-empty-p old)
    (error "The text to replace is empty; give the exact text to replace"))
  (let ((case-fold-search nil) (count 0) first)
    (save-excursion
      (goto-char (point-min))
      (while (and (< count 2) (search-forward old nil t))
        (setq count (1+ count)
              first (or first (match-beginning 0)))
        (goto-char (1+ (match-beginning 0)))))
    (pcase count
      (0 (error "The text to replace does not occur in %s; read the buffer and copy it exactly"
                (buffer-name)))
      (1 first)
      (_ (error "The text to replace occurs more than once in %s; include more of the text around it"
                (buffer-name))))))

(defun opencortex--tool-context (beg end)
  "The text around BEG..END of the current buffer, as a plist.
:before runs from the start of the `opencortex-tools-context-lines'th
line before BEG, :after to the end of that many lines after END (each
at most 4000 characters); :line is the number of :before's first line."
  (let* ((lines opencortex-tools-context-lines)
         (from (save-excursion (goto-char beg) (forward-line (- lines)) (point)))
         (to (save-excursion (goto-char end) (forward-line (1+ lines)) (point)))
         (from (max from (- beg 4000)))
         (to (min to (+ end 4000))))
    (list :before (buffer-substring-no-properties from beg)
          :after (buffer-substring-no-properties end to)
          :line (line-number-at-pos from t))))

(defun opencortex--tool-change (buffer beg end text)
  "Replace BEG..END of BUFFER with TEXT, made visible; the kernel's answer.
The change is undoable as any edit; point stays where it was."
  (let ((text (opencortex--visible text)))
    (when (> (length text) opencortex-tools-max-chars)
      (error "The text has %d characters; at most %d go in at once"
             (length text) opencortex-tools-max-chars))
    (with-current-buffer buffer
      (save-restriction
        (widen)
        (save-excursion
          (goto-char beg)
          (delete-region beg end)
          (insert text)
          (opencortex--changed beg (point))
          (list :buffer (buffer-name) :line (line-number-at-pos beg t)
                :chars (length text)))))))

;;;; Buffers

(defun opencortex--tool-list-buffers (limit)
  "Method `opencortex-tool-list-buffers': describe at most LIMIT buffers.
Answers (:buffers LIST :total N), each of LIST a plist of :name, :mode,
:file (nil without one), :modified and :size (characters).  Internal
buffers (names starting with a space) are left out."
  (opencortex--tool-answer
    (let* ((buffers (cl-remove-if (lambda (b) (string-prefix-p " " (buffer-name b)))
                                  (buffer-list)))
           (limit (if (natnump limit) limit 100)))
      (list :buffers (mapcar (lambda (buffer)
                               (with-current-buffer buffer
                                 (list :name (buffer-name) :mode (symbol-name major-mode)
                                       :file buffer-file-name :modified (buffer-modified-p)
                                       :size (buffer-size))))
                             (cl-subseq buffers 0 (min limit (length buffers))))
            :total (length buffers)))))

(defun opencortex--tool-region (buffer)
  "The active region of BUFFER as (BEG . END), or an error."
  (with-current-buffer buffer
    (let ((mark (mark t)))
      (unless (and mark-active mark)
        (error "Buffer %s has no active region" (buffer-name)))
      (let ((point (opencortex--tool-point buffer)))
        (cons (min mark point) (max mark point))))))

(defun opencortex--tool-read-buffer (buffer region max-chars)
  "Method `opencortex-tool-read-buffer': the text of BUFFER, without properties.
With REGION non-nil, only its active region.  At most MAX-CHARS
characters (and `opencortex-tools-max-chars'); answers (:text TEXT
:chars ALL :truncated BOOL :line FIRST-LINE)."
  (opencortex--tool-answer
    (let ((buffer (opencortex--tool-buffer buffer))
          (limit (opencortex--tool-limit max-chars)))
      (with-current-buffer buffer
        (save-restriction
          (widen)
          (let* ((bounds (if region (opencortex--tool-region buffer)
                           (cons (point-min) (point-max))))
                 (beg (car bounds))
                 (end (min (cdr bounds) (+ beg limit))))
            (list :text (buffer-substring-no-properties beg end)
                  :chars (- (cdr bounds) beg) :truncated (< end (cdr bounds))
                  :line (line-number-at-pos beg t))))))))

(defun opencortex--tool-around (buffer at old)
  "Method `opencortex-tool-around': the lines around a change to BUFFER.
With OLD a string, around its one occurrence; else around where AT
points.  See `opencortex--tool-context' for the answer."
  (opencortex--tool-answer
    (let ((buffer (opencortex--tool-buffer buffer)))
      (with-current-buffer buffer
        (save-restriction
          (widen)
          (let ((beg (if (stringp old)
                         (opencortex--tool-find-once old)
                       (opencortex--tool-position buffer at))))
            (opencortex--tool-context beg (+ beg (if (stringp old) (length old) 0)))))))))

(defun opencortex--tool-insert (buffer text at)
  "Method `opencortex-tool-insert': insert TEXT into BUFFER at AT.
AT is \"end\", \"point\" (the person's point) or \"start\".  The buffer
must exist and be writable (see `opencortex--tool-check-writable')."
  (opencortex--tool-answer
    (opencortex--check-string text "text")
    (let ((buffer (opencortex--tool-buffer buffer)))
      (opencortex--tool-check-writable buffer)
      (let ((position (opencortex--tool-position buffer at)))
        (opencortex--tool-change buffer position position text)))))

(defun opencortex--tool-replace (buffer old new)
  "Method `opencortex-tool-replace': replace OLD with NEW in BUFFER.
OLD must occur exactly once (see `opencortex--tool-find-once')."
  (opencortex--tool-answer
    (opencortex--check-string new "new")
    (let ((buffer (opencortex--tool-buffer buffer)))
      (opencortex--tool-check-writable buffer)
      (let ((beg (with-current-buffer buffer
                   (save-restriction (widen) (opencortex--tool-find-once old)))))
        (opencortex--tool-change buffer beg (+ beg (length old)) new)))))

(provide 'opencortex-tools)
;;; opencortex-tools.el ends here
