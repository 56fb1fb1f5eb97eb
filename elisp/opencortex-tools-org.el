;;; opencortex-tools-org.el --- What the kernel's org tools do in Emacs  -*- lexical-binding: t; coding: utf-8 -*-

;; This file is part of opencortex.
;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; The methods behind the kernel's org tools (see opencortex-tools.el for
;; the others and for the rules all of them keep): file a note as an org
;; entry, list agenda entries for a range of dates, and show a file at an
;; org heading.  None asks anything or selects a window; a file is visited
;; with only its safe local variables; agenda files opened to read them
;; are closed again, and so is a capture file opened to file a note.

;;; Code:

(require 'cl-lib)
(require 'org)
(require 'subr-x)
(require 'opencortex-chat)
(require 'opencortex-tools)

(declare-function org-agenda-get-day-entries "org-agenda" (file date &rest args))
(declare-function calendar-absolute-from-gregorian "calendar" (date))
(declare-function calendar-gregorian-from-absolute "calendar" (date))
(defvar org-agenda-markers)
(defvar org-agenda-buffer)

(defcustom opencortex-tools-display-action
  '((display-buffer-reuse-window display-buffer-pop-up-window
                                 display-buffer-use-some-window)
    (inhibit-same-window . t))
  "How `opencortex-tool-open' shows a file: a `display-buffer' action.
The default shows it in another window and never selects it, so the
chat input keeps the focus."
  :type 'sexp
  :group 'opencortex)

;;;; Capture

(defconst opencortex--org-structure-regexp
  (rx bol (group (* (any " \t"))) (group (* ",") (or "*" "#+" (seq ":" (* (not (any ": \n"))) ":" (* (any " \t")) eol))))
  "Body lines org would read as structure: a heading, a keyword or block, a drawer.")

(defun opencortex--org-body (text)
  "TEXT as the body of an org entry: visible, ending in a newline.
Lines org would read as structure get org's comma escape."
  (replace-regexp-in-string opencortex--org-structure-regexp "\\1,\\2"
                            (opencortex--ensure-newline (opencortex--visible text)) t))

(defun opencortex--tool-check-encodable (text)
  "Signal an error unless the current buffer's file coding system can save TEXT.
Saving it anyway would ask which coding system to use."
  (let ((coding buffer-file-coding-system))
    (when (and coding (unencodable-char-position 0 (length text) coding nil text))
      (error "%s is saved as %s, which cannot hold every character of the note"
             (buffer-name) coding))))

(defun opencortex--tool-append-entry (heading text)
  "Append the entry HEADING with body TEXT to the current org buffer.
It gets a CREATED property (an inactive timestamp); answer its line."
  (let ((title (opencortex--inert-line heading 200))
        (body (opencortex--org-body text)))
    (opencortex--tool-check-encodable (concat title body))
    (save-restriction
      (widen)
      (save-excursion
        (goto-char (point-max))
        (unless (bolp) (insert "\n"))
        (let ((start (point)))
          (insert "* " title "\n")
          (org-entry-put start "CREATED" (format-time-string "[%Y-%m-%d %a %H:%M]"))
          (goto-char (point-max))
          (unless (bolp) (insert "\n"))
          (insert body)
          (opencortex--changed start (point))
          (line-number-at-pos start t))))))

(defun opencortex--tool-capture (file heading text)
  "Method `opencortex-tool-capture': file TEXT under HEADING at the end of FILE.
FILE is an org file.  It is saved unless its buffer already had unsaved
changes (those are the person's to save); a buffer opened for this is
closed again.  Answers (:file FILE :line N :saved BOOL)."
  (opencortex--tool-answer
    (opencortex--check-string file "file")
    (opencortex--check-string heading "heading")
    (opencortex--check-string text "text")
    (let* ((file (expand-file-name file))
           (visited (find-buffer-visiting file))
           (unsaved (and visited (buffer-modified-p visited))))
      (unless (file-directory-p (file-name-directory file))
        (error "The directory of the capture file %s does not exist" file))
      (let ((buffer (or visited (opencortex--tool-find-file file))))
        (unwind-protect
            (with-current-buffer buffer
              (unless (derived-mode-p 'org-mode)
                (error "%s is not an org file (its buffer is in %s)" file major-mode))
              (opencortex--tool-check-writable buffer)
              (let ((line (opencortex--tool-append-entry heading text)))
                (unless unsaved
                  (let ((save-silently t)) (save-buffer)))
                (list :file file :line line :saved (not unsaved))))
          (unless visited
            (with-current-buffer buffer (set-buffer-modified-p nil))
            (kill-buffer buffer)))))))

;;;; Agenda

(defun opencortex--tool-day (iso)
  "The ISO date YYYY-MM-DD as a calendar absolute day number."
  (opencortex--check-string iso "date")
  (unless (string-match "\\`\\([0-9]\\{4\\}\\)-\\([0-9]\\{2\\}\\)-\\([0-9]\\{2\\}\\)\\'" iso)
    (error "Dates are YYYY-MM-DD, not %s" (opencortex--one-line iso 40)))
  (let* ((date (mapcar (lambda (group) (string-to-number (match-string group iso))) '(2 3 1)))
         (day (calendar-absolute-from-gregorian date)))
    (unless (equal (calendar-gregorian-from-absolute day) date)
      (error "There is no date %s" iso))
    day))

(defun opencortex--tool-agenda-entry (entry date)
  "The agenda ENTRY of DATE as a plist.
ENTRY is a string from `org-agenda-get-day-entries'."
  (let* ((todo (get-text-property 0 'todo-state entry))
         (todo (and todo (substring-no-properties todo)))
         (text (substring-no-properties (or (get-text-property 0 'txt entry) entry)))
         (time (get-text-property 0 'time-of-day entry))
         (marker (get-text-property 0 'org-marker entry))
         (buffer (and (markerp marker) (marker-buffer marker))))
    (list :date (format "%04d-%02d-%02d" (nth 2 date) (nth 0 date) (nth 1 date))
          :time (and (integerp time) (format "%02d:%02d" (/ time 100) (% time 100)))
          :todo todo
          :heading (string-trim (if (and todo (string-prefix-p (concat todo " ") text))
                                    (substring text (1+ (length todo)))
                                  text))
          :kind (get-text-property 0 'type entry)
          :file (and buffer (buffer-file-name buffer)
                     (abbreviate-file-name (buffer-file-name buffer))))))

(defun opencortex--tool-agenda-files ()
  "The readable files of `org-agenda-files' (directories expanded)."
  (cl-remove-if-not #'file-readable-p (org-agenda-files t)))

(defun opencortex--tool-agenda (from to limit)
  "Method `opencortex-tool-agenda': agenda entries from FROM to TO, at most LIMIT.
FROM and TO are dates YYYY-MM-DD, at most 366 days apart.  Entries are
scheduled items, deadlines and timestamps of the readable files of
`org-agenda-files' (no diary sexps: nothing is evaluated).  Answers
\(:entries LIST :truncated BOOL :files N); see
`opencortex--tool-agenda-entry'.  Agenda files this opens are closed
again."
  (opencortex--tool-answer
    (require 'org-agenda)
    (let ((first (opencortex--tool-day from))
          (last (opencortex--tool-day to))
          (limit (if (natnump limit) limit 200))
          (files (opencortex--tool-agenda-files))
          (before (buffer-list))
          (org-agenda-buffer nil)
          (org-agenda-markers nil)
          entries truncated)
      (when (> first last) (error "The range ends (%s) before it starts (%s)" to from))
      (when (> (- last first) 366) (error "The range is longer than 366 days"))
      (unwind-protect
          (let ((enable-local-variables :safe) (large-file-warning-threshold nil))
            (catch 'full
              (cl-loop for day from first to last do
                       (let ((date (calendar-gregorian-from-absolute day)))
                         (dolist (file files)
                           (dolist (entry (org-agenda-get-day-entries
                                           file date :deadline :scheduled :timestamp))
                             (when (>= (length entries) limit)
                               (setq truncated t)
                               (throw 'full nil))
                             (push (opencortex--tool-agenda-entry entry date) entries)))))))
        (dolist (marker org-agenda-markers) (set-marker marker nil))
        (dolist (buffer (buffer-list))
          (unless (or (memq buffer before) (not (buffer-file-name buffer))
                      (buffer-modified-p buffer))
            (kill-buffer buffer))))
      (list :entries (nreverse entries) :truncated truncated :files (length files)))))

;;;; Showing a file

(defun opencortex--tool-show-heading (buffer heading)
  "Move BUFFER's point to the org HEADING (exact text) and reveal it.
Answer the position, or signal an error when there is no such heading."
  (with-current-buffer buffer
    (unless (derived-mode-p 'org-mode)
      (error "%s is not an org file, so it has no headings" (buffer-name)))
    (widen)
    (let ((position (org-find-exact-headline-in-buffer heading buffer t)))
      (unless position
        (error "%s has no heading %s" (buffer-name) (opencortex--one-line heading 200)))
      (goto-char position)
      (if (fboundp 'org-fold-show-context)
          (org-fold-show-context 'link-search)
        (with-no-warnings (org-show-context 'link-search)))
      (point))))

(defun opencortex--tool-open (file heading)
  "Method `opencortex-tool-open': show FILE, at the org HEADING when non-nil.
The file is shown with `opencortex-tools-display-action' (another window,
not selected).  Answers (:buffer NAME :shown BOOL :line N)."
  (opencortex--tool-answer
    (opencortex--check-string file "file")
    (let ((file (expand-file-name file)))
      (unless (file-regular-p file)
        (error "No file %s (or it is not a regular file)" file))
      (let* ((buffer (opencortex--tool-find-file file))
             (position (and (stringp heading) (not (string-empty-p heading))
                            (opencortex--tool-show-heading buffer heading)))
             (window (display-buffer buffer opencortex-tools-display-action)))
        (when (and window position)
          (set-window-point window position))
        (with-current-buffer buffer
          (list :buffer (buffer-name) :shown (and window t)
                :line (line-number-at-pos (or position (point)) t)))))))

(provide 'opencortex-tools-org)
;;; opencortex-tools-org.el ends here
